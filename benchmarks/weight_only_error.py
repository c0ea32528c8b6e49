"""The error table of docs/weight_only.md, in one command:

    .venv/bin/python benchmarks/weight_only_error.py

For each packable scheme: bits per weight, the relative weight error the scheme's bits
predict (``e_w``, tests/quant/test_weight_only.py's formula) and the one measured on an
N(0, 1) [256 x 4096] weight, then ``rlx.quantize(weights_only=True)`` of the MLP and the
MiniLM-sized encoder of that test file: the output error against its NumPy f32 forward
pass and the bound ``2 sqrt(L) max e_w`` the tests hold it to.
"""

from __future__ import annotations

import math
import sys

from _common import ROOT

sys.path.insert(0, str(ROOT / "tests" / "quant"))

import numpy as np  # noqa: E402
import test_weight_only as T  # noqa: E402

import rlx  # noqa: E402
from rlx.errors import QuantizationError  # noqa: E402
from rlx.models import synthetic as syn  # noqa: E402
from rlx.quant.pack import pack  # noqa: E402


def main() -> None:
    w = np.random.default_rng(0).standard_normal((256, 4096)).astype(np.float32)
    models = [
        (T.mlp_graph(), T.mlp_numpy, 2),
        (syn.encoder(layers=6, hidden=384, heads=12, ffn=1536, seq=16), T.encoder_numpy, 24),
    ]
    print(
        "| scheme | bits / weight | e_w predicted | e_w measured | MLP output error | MLP bound "
        "| encoder output error (layers) | encoder bound |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for s in T.PACKABLE:
        arrays = pack(s, w)
        bits = sum(a.nbytes for a in arrays) * 8 / w.size
        meas = float(np.linalg.norm(T.decode(s, arrays, w.shape[1]) - w) / np.linalg.norm(w))
        row = f"| {s} | {bits:.2f} | {T.e_w(s, w):.4f} | {meas:.4f} |"
        for g, forward, depth in models:
            params = syn.random_params(g, seed=1)
            batch = syn.random_inputs(g, seed=0)
            try:
                r = rlx.quantize(
                    g, [batch], params=params, weights_only=True, scheme=s, rank_layers=False
                )
            except QuantizationError:
                row += " n/a | n/a |"
                continue
            ews = [T.e_w(s, params[n].T) for n in r.report.quantized]
            (got,) = r.compiled.run(batch)
            err = T.rel(got, forward(params, next(iter(batch.values()))))
            row += (
                f" {err:.4f} ({len(r.report.quantized)}) | {2 * math.sqrt(depth) * max(ews):.3f} |"
            )
        print(row, flush=True)


if __name__ == "__main__":
    main()
