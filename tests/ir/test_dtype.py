"""The promotion lattice against JAX's: every pair of our dtypes is promoted by
``rlx.dtype.promote`` exactly as JAX's ``promote_types`` lattice (x64, "standard" mode) joins
them, except the differences documented in ``rlx/dtype.py``."""

from __future__ import annotations

import itertools

import pytest

from rlx.dtype import DType, promote, promote_all
from rlx.errors import DTypeError

D = DType

# JAX's lattice (jax._src.dtypes._type_promotion_lattice, "standard"), with its names:
# b1 bool, u1..u8 uint8..uint64, i1..i8 int8..int64, bf bfloat16, f2/f4/f8 float16/32/64,
# c4/c8 complex64/128, e4/e5 the float8 types, i*/f*/c* the weak types.
JAX_LATTICE: dict[str, tuple[str, ...]] = {
    "b1": ("i*",),
    "i*": ("u1", "i1"),
    "u1": ("i2", "u2"),
    "u2": ("i4", "u4"),
    "u4": ("i8", "u8"),
    "u8": ("f*",),
    "i1": ("i2",),
    "i2": ("i4",),
    "i4": ("i8",),
    "i8": ("f*",),
    "f*": ("e4", "e5", "bf", "f2", "c*"),
    "e4": (),
    "e5": (),
    "bf": ("f4",),
    "f2": ("f4",),
    "f4": ("f8", "c4"),
    "f8": ("c8",),
    "c*": ("c4",),
    "c4": ("c8",),
    "c8": (),
}
JAX_NAME = {
    D.BOOL: "b1",
    D.U8: "u1",
    D.U32: "u4",
    D.I8: "i1",
    D.I16: "i2",
    D.I32: "i4",
    D.I64: "i8",
    D.BF16: "bf",
    D.F16: "f2",
    D.F32: "f4",
    D.F64: "f8",
    D.C64: "c4",
    D.F8E4M3: "e4",
    D.F8E5M2: "e5",
}
# (a, b) -> JAX's result, for the pairs where we knowingly differ (see rlx/dtype.py)
DIFFERENCES = {frozenset({D.F64, D.C64}): "c8"}


def _up(t: str) -> set[str]:
    out = {t}
    for u in JAX_LATTICE[t]:
        out |= _up(u)
    return out


def jax_join(a: str, b: str) -> str | None:
    """The least upper bound of ``a`` and ``b`` in JAX's lattice, None when there is none."""
    common = _up(a) & _up(b)
    least = [c for c in common if _up(c) >= common]
    return least[0] if least else None


def test_every_dtype_is_mapped():
    assert set(JAX_NAME) == set(DType)


@pytest.mark.parametrize(
    "a, b", list(itertools.combinations_with_replacement(list(DType), 2)), ids=str
)
def test_promotion_matches_jax(a: DType, b: DType):
    want = jax_join(JAX_NAME[a], JAX_NAME[b])
    key = frozenset({a, b})
    if key in DIFFERENCES:
        assert want == DIFFERENCES[key], "JAX's answer changed: update rlx/dtype.py"
        assert promote(a, b) is D.C64
        return
    if want is None:
        with pytest.raises(DTypeError, match=f"no implicit promotion between {a} and {b}"):
            promote(a, b)
        with pytest.raises(DTypeError):
            promote(b, a)
        return
    got = promote(a, b)
    assert JAX_NAME[got] == want, f"promote({a}, {b}) = {got}, JAX gives {want}"
    assert promote(b, a) is got


# a literal table of the pairs the docs mention, in case the lattice above is misread
EXPECTED = [
    (D.I8, D.U8, D.I16),
    (D.U32, D.I32, D.I64),
    (D.U32, D.I64, D.I64),
    (D.U8, D.U32, D.U32),
    (D.BOOL, D.I8, D.I8),
    (D.F16, D.BF16, D.F32),
    (D.I64, D.F16, D.F16),
    (D.I32, D.BF16, D.BF16),
    (D.BOOL, D.F32, D.F32),
    (D.F32, D.C64, D.C64),
    (D.I64, D.C64, D.C64),
    (D.F64, D.C64, D.C64),  # JAX: complex128, which we lack
    (D.I32, D.F8E4M3, D.F8E4M3),
    (D.BOOL, D.F8E5M2, D.F8E5M2),
]


@pytest.mark.parametrize("a, b, want", EXPECTED, ids=str)
def test_documented_pairs(a: DType, b: DType, want: DType):
    assert promote(a, b) is want and promote(b, a) is want


@pytest.mark.parametrize(
    "a, b",
    [(D.F8E4M3, D.F32), (D.F8E4M3, D.F8E5M2), (D.F8E5M2, D.BF16), (D.F8E4M3, D.C64)],
    ids=str,
)
def test_fp8_has_no_implicit_promotion_with_other_floats(a: DType, b: DType):
    with pytest.raises(DTypeError, match="insert an explicit cast"):
        promote(a, b)


def test_promotion_is_associative_where_defined():
    for a, b, c in itertools.product(list(DType), repeat=3):
        try:
            left = promote(promote(a, b), c)
        except DTypeError:
            left = None
        try:
            right = promote(a, promote(b, c))
        except DTypeError:
            right = None
        if left is not None and right is not None:
            assert left is right, (a, b, c)
    assert promote_all(D.I8, D.U8, D.F16) is D.F16
