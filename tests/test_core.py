import numpy as np
import pytest

import rlx
from rlx import DType, Shape, sym
from rlx.errors import DTypeError, InputError, ShapeError, VerifyError


def test_promotion_lattice():
    D = DType
    assert rlx.promote(D.I8, D.U8) is D.I16
    assert rlx.promote(D.U32, D.I32) is D.I64
    assert rlx.promote(D.F16, D.BF16) is D.F32
    assert rlx.promote(D.I32, D.F16) is D.F16
    assert rlx.promote(D.BOOL, D.F32) is D.F32
    assert rlx.promote(D.F64, D.C64) is D.C64
    with pytest.raises(DTypeError):
        rlx.promote(D.F8E4M3, D.F32)


@pytest.mark.parametrize("d", list(DType))
def test_dtype_numpy_roundtrip(d):
    assert DType.from_numpy(d.np) is d
    assert d.itemsize == np.zeros(1, d.np).itemsize
    assert DType.parse(d.value) is d


def test_symbolic_dims_multiply_and_divide():
    b, s = sym("batch"), sym("seq")
    assert (b * s).divide(b) == s
    assert (b * s * 4).evaluate({"batch": 2, "seq": 3}) == 24
    assert Shape((b, s, 8)).numel == b * s * 8


def test_build_evaluate_and_errors_name_user_line():
    g = rlx.Graph("t")
    b = g.sym("batch", max=8)
    x = g.input("x", (b, 4))
    y = g.add(g.gelu(x), 1.0)
    g.set_outputs([y])
    g.verify()
    (out,) = g.evaluate({"x": np.zeros((3, 4), np.float32)})
    assert out.shape == (3, 4) and np.allclose(out, 1.0)
    with pytest.raises(ShapeError) as ei:
        g.add(x, g.constant(np.zeros((5, 4), np.float32)))
    assert "test_core.py" in str(ei.value) and "[batch,4]" in str(ei.value)
    assert len(g) == 5  # the failed add left no node behind (the constant is its own call)
    with pytest.raises(InputError, match="outside its declared bounds"):
        g.evaluate({"x": np.zeros((9, 4), np.float32)})


def test_verifier_catches_bad_recorded_shape():
    g = rlx.Graph("bad")
    x = g.input("x", (2, 3))
    g.add_node(rlx.ops.OPS["unary"](rlx.ops.elementwise.UnaryKind.EXP), [x], Shape((2, 4)))
    g.set_outputs([1])
    with pytest.raises(VerifyError, match="shape rule gives"):
        g.verify()
