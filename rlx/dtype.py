"""DType: the element types of rlx tensors, their NumPy mapping and the promotion lattice.

Promotion is the least upper bound in this lattice (edges point to the wider type)::

    Bool -> U8 -> I16 -> I32 -> I64
    Bool -> I8 -> I16
    U8 -> U32 -> I64
    I64 -> F16, BF16, F8E4M3, F8E5M2   (so an int or bool meeting a float takes the float)
    F16 -> F32, BF16 -> F32, F32 -> F64, F64 -> C64
    F8E4M3, F8E5M2: no edges up

This is JAX's lattice (``jax.numpy.promote_types``, x64 enabled, "standard" mode; see
https://docs.jax.dev/en/latest/type_promotion.html) restricted to our types, with JAX's
weak types (``i*``, ``f*``, ``c*``) left out. Consequences shared with JAX: I8+U8 -> I16,
U32+I32 -> I64, F16+BF16 -> F32 (neither holds the other), any integer + F16 -> F16,
I64+C64 -> C64, and FP8 types have no implicit promotion with another float or complex
type (F8E4M3+F32 and F8E4M3+F8E5M2 are a DTypeError: cast explicitly), while an integer or
bool meeting an FP8 tensor takes the FP8 type.

Where we differ from JAX, and why:

* JAX has U16, U64 and C128; we have none of them. Our U8 -> U32 edge stands for JAX's
  U8 -> U16 -> U32 path (same results on our types). Without C128, F64+C64 -> C64 (JAX:
  C128) and C64 is the top of the lattice. Without U64 nothing leaves the integers by
  promotion (JAX: U64+I64 -> the weak float ``f*``).
* JAX has F32 -> C64 and F64 -> C128; we have only F64 -> C64, which gives the same
  F32+C64 -> C64.
* Weak types (Python scalars) are handled by the graph builder, not by this table: a
  Python scalar takes the dtype of the tensor it meets, as a weakly-typed JAX value does.
"""

from __future__ import annotations

import enum
import sys
from functools import cache

import numpy as np
import numpy.typing as npt

from rlx.errors import DTypeError

__all__ = ["DType", "bf16_np", "f8e4m3_np", "f8e5m2_np", "is_bf16", "promote", "promote_all"]


class DType(enum.Enum):
    """Element type. ``value`` is the short name used in printed IR and files."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F64 = "f64"
    I8 = "i8"
    I16 = "i16"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    U32 = "u32"
    BOOL = "bool"
    C64 = "c64"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"

    def __repr__(self) -> str:
        return f"DType.{self.name}"

    def __str__(self) -> str:
        return self.value

    @property
    def np(self) -> np.dtype:
        """The NumPy dtype that stores this type (BF16 / FP8: imports ml_dtypes)."""
        d = _TO_NP.get(self)
        return d if d is not None else _lowp_to_np()[self]

    @property
    def itemsize(self) -> int:
        """Bytes per element (without importing ml_dtypes)."""
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        """Real floating point (F16, BF16, F32, F64 and the FP8 types)."""
        return self in _FLOATS

    @property
    def is_int(self) -> bool:
        """Signed or unsigned integer (not Bool)."""
        return self in _INTS

    @property
    def is_signed(self) -> bool:
        """Signed integer, float or complex."""
        return self in _SIGNED

    @property
    def is_complex(self) -> bool:
        """Complex (C64)."""
        return self is DType.C64

    @property
    def is_bool(self) -> bool:
        """Bool."""
        return self is DType.BOOL

    @property
    def is_fp8(self) -> bool:
        """One of the two FP8 types (F8E4M3, F8E5M2)."""
        return self in (DType.F8E4M3, DType.F8E5M2)

    @classmethod
    def from_numpy(cls, dt: npt.DTypeLike) -> DType:
        """Map a NumPy dtype to a DType; raises DTypeError for unsupported types."""
        try:
            key = np.dtype(dt)
        except TypeError as e:
            if not isinstance(dt, str):
                raise DTypeError(f"not a NumPy dtype: {dt!r}") from e
            _lowp_to_np()  # a name such as 'bfloat16' needs ml_dtypes registered
            try:
                key = np.dtype(dt)
            except TypeError as e2:
                raise DTypeError(f"not a NumPy dtype: {dt!r}") from e2
        got = _FROM_NP.get(key)
        if got is not None:
            return got
        if "ml_dtypes" in sys.modules:  # without it no dtype can be bf16 / fp8
            for k, v in _lowp_to_np().items():
                if v == key:
                    return k
        supported = ", ".join(sorted([str(k) for k in _FROM_NP] + _LOWP_NAMES))
        raise DTypeError(f"NumPy dtype {key} has no rlx DType; supported: {supported}")

    @classmethod
    def parse(cls, name: str | DType) -> DType:
        """Accept a DType or its short name ('f32', 'bf16', ...)."""
        if isinstance(name, DType):
            return name
        try:
            return cls(name)
        except ValueError:
            raise DTypeError(
                f"unknown dtype name {name!r}; expected one of {[d.value for d in cls]}"
            ) from None


# BF16 and the FP8 types live in ml_dtypes, whose import costs about 0.5 s (it registers
# its ufunc loops): it is imported on first use of one of them (``bf16_np`` and friends,
# ``DType.np``), so an f32 model never imports it.
_TO_NP: dict[DType, np.dtype] = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.F64: np.dtype(np.float64),
    DType.I8: np.dtype(np.int8),
    DType.I16: np.dtype(np.int16),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.U8: np.dtype(np.uint8),
    DType.U32: np.dtype(np.uint32),
    DType.BOOL: np.dtype(np.bool_),
    DType.C64: np.dtype(np.complex64),
}
_FROM_NP: dict[np.dtype, DType] = {v: k for k, v in _TO_NP.items()}
_ITEMSIZE: dict[DType, int] = {k: v.itemsize for k, v in _TO_NP.items()}
_ITEMSIZE |= {DType.BF16: 2, DType.F8E4M3: 1, DType.F8E5M2: 1}
_LOWP_NAMES = ["bfloat16", "float8_e4m3fn", "float8_e5m2"]


@cache
def _lowp_to_np() -> dict[DType, np.dtype]:
    import ml_dtypes

    return {
        DType.BF16: np.dtype(ml_dtypes.bfloat16),
        DType.F8E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
        DType.F8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    }


def bf16_np() -> np.dtype:
    """The NumPy bfloat16 dtype (ml_dtypes), imported on the first call."""
    return _lowp_to_np()[DType.BF16]


def f8e4m3_np() -> np.dtype:
    """The NumPy float8_e4m3fn dtype (ml_dtypes), imported on the first call."""
    return _lowp_to_np()[DType.F8E4M3]


def f8e5m2_np() -> np.dtype:
    """The NumPy float8_e5m2 dtype (ml_dtypes), imported on the first call."""
    return _lowp_to_np()[DType.F8E5M2]


def is_bf16(dt: object) -> bool:
    """Whether the NumPy dtype ``dt`` is bfloat16; never imports ml_dtypes (without it
    loaded no array can be bfloat16)."""
    return "ml_dtypes" in sys.modules and dt == bf16_np()


_FLOATS = frozenset({DType.F32, DType.F16, DType.BF16, DType.F64, DType.F8E4M3, DType.F8E5M2})
_INTS = frozenset({DType.I8, DType.I16, DType.I32, DType.I64, DType.U8, DType.U32})
_SIGNED = frozenset({DType.I8, DType.I16, DType.I32, DType.I64}) | _FLOATS | {DType.C64}

_D = DType
_EDGES: dict[DType, tuple[DType, ...]] = {
    _D.BOOL: (_D.U8, _D.I8),
    _D.U8: (_D.I16, _D.U32),
    _D.I8: (_D.I16,),
    _D.I16: (_D.I32,),
    _D.I32: (_D.I64,),
    _D.U32: (_D.I64,),
    _D.I64: (_D.F16, _D.BF16, _D.F8E4M3, _D.F8E5M2),
    _D.F16: (_D.F32,),
    _D.BF16: (_D.F32,),
    _D.F32: (_D.F64,),
    _D.F64: (_D.C64,),
    _D.C64: (),
    _D.F8E4M3: (),
    _D.F8E5M2: (),
}


@cache
def _upper(d: DType) -> frozenset[DType]:
    out = {d}
    for e in _EDGES[d]:
        out |= _upper(e)
    return frozenset(out)


@cache
def promote(a: DType, b: DType) -> DType:
    """Least upper bound of two dtypes in the lattice above; DTypeError if none."""
    if a is b:
        return a
    common = _upper(a) & _upper(b)
    if not common:
        raise DTypeError(f"no implicit promotion between {a} and {b}; insert an explicit cast")
    # the least element: the one whose upper set contains all the others
    for c in common:
        if _upper(c) >= common:
            return c
    raise AssertionError("promotion lattice is not a lattice")  # pragma: no cover


def promote_all(*ds: DType) -> DType:
    """Promote any number of dtypes left to right."""
    out = ds[0]
    for d in ds[1:]:
        out = promote(out, d)
    return out
