import numpy as np
import pytest
from hypothesis import given
from hypothesis.extra import numpy as hnp

import rlx
from rlx import DType, Shape, sym
from rlx.dtype import promote
from rlx.errors import DTypeError, InputError, ShapeError, VerifyError
from rlx.shape import broadcast_dims


def test_promotion_lattice():
    D = DType
    assert promote(D.I8, D.U8) is D.I16
    assert promote(D.U32, D.I32) is D.I64
    assert promote(D.F16, D.BF16) is D.F32
    assert promote(D.I32, D.F16) is D.F16
    assert promote(D.BOOL, D.F32) is D.F32
    assert promote(D.F64, D.C64) is D.C64
    with pytest.raises(DTypeError):
        promote(D.F8E4M3, D.F32)


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


@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=4, max_side=3))
def test_broadcast_dims_matches_numpy(shapes):
    assert broadcast_dims(*shapes.input_shapes) == shapes.result_shape


def test_broadcast_dims_with_symbols_and_errors():
    b = sym("batch")
    assert broadcast_dims((b, 1), (4,)) == (b, 4)
    assert broadcast_dims((b, 4), (1, 4), (b, 1)) == (b, 4)
    with pytest.raises(
        ShapeError, match=r"\[batch,4\] and \[3,4\] do not broadcast: dim 0 is batch vs 3"
    ):
        broadcast_dims((b, 4), (3, 4))
    with pytest.raises(ShapeError, match="do not broadcast"):
        broadcast_dims((b,), (sym("seq"),))


def test_shape_basics():
    s = Shape(("batch", 3), "bf16")
    assert str(s) == "bf16[batch,3]" and s.rank == 2 and not s.is_static
    assert s.symbols == frozenset({"batch"}) and s.concrete({"batch": 5}) == (5, 3)
    assert s.nbytes({"batch": 5}) == 30 and s.axis(-1) == 1
    with pytest.raises(ShapeError, match=r"axis 2 out of range for rank-2 shape bf16\[batch,3\]"):
        s.axis(2)
    with pytest.raises(ShapeError, match="symbolic dim 'batch' has no value bound"):
        s.concrete({})
    with pytest.raises(ShapeError, match="dims must be >= 0, got -1"):
        Shape((-1,))
    with pytest.raises(DTypeError, match="unknown dtype name 'f33'"):
        Shape((1,), "f33")
    assert (sym("a") * 6).divide(4) is None and (sym("a") * 6).divide(3) == sym("a") * 2
