"""Shape: dims (static ints or symbolic :class:`Sym`) plus a dtype; NumPy broadcasting.

A symbolic dim is a monomial ``coeff * s1^p1 * s2^p2 ...`` over named symbols, so the
flattening reshape ``[batch, seq, d] -> [batch*seq, d]`` and its inverse stay symbolic.
Sums of symbols (concatenation along a symbolic axis) are not representable: such ops
raise a ShapeError asking for static dims.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rlx.dtype import DType
from rlx.errors import ShapeError

__all__ = [
    "Sym",
    "Dim",
    "Shape",
    "sym",
    "check_bounds",
    "broadcast_dims",
    "dims_product",
    "dim_str",
]


@dataclass(frozen=True, slots=True)
class Sym:
    """A symbolic dimension: ``coeff * prod(name**power)``; hashable and printable.

    ``Sym("seq")`` (same as ``sym("seq")`` and ``Sym.named("seq")``) is the symbol ``seq``;
    ``Sym("seq", 2)`` is ``2*seq``; ``Sym((("b", 1), ("s", 2)), 3)`` is ``3*b*s^2``. Names
    must be identifiers, powers and the coefficient ints >= 1 (ShapeError otherwise);
    terms are kept sorted by name, so equal monomials compare equal."""

    terms: tuple[tuple[str, int], ...]
    coeff: int = 1

    def __post_init__(self) -> None:
        terms, coeff = self.terms, self.coeff
        if type(coeff) is int and coeff >= 1 and type(terms) is tuple and _canonical(terms):
            return  # the common case, kept cheap: shape rules build Syms all the time
        if isinstance(terms, str):
            terms = ((terms, 1),)
        object.__setattr__(self, "terms", _check_terms(terms, coeff))
        object.__setattr__(self, "coeff", _check_int(coeff, f"symbolic dim {self}: coefficient"))

    @staticmethod
    def named(name: str) -> Sym:
        """The symbol ``name`` (an identifier)."""
        return Sym(((name, 1),), 1)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.terms)

    def __mul__(self, other: Dim) -> Dim:
        if isinstance(other, int):
            if other == 0:
                return 0
            return Sym(self.terms, self.coeff * other)
        powers = dict(self.terms)
        for n, p in other.terms:
            powers[n] = powers.get(n, 0) + p
        return _mk(powers, self.coeff * other.coeff)

    __rmul__ = __mul__

    def divide(self, other: Dim) -> Dim | None:
        """Exact division, or None when ``other`` does not divide ``self``."""
        if isinstance(other, int):
            if other == 0 or self.coeff % other:
                return None
            return Sym(self.terms, self.coeff // other)
        powers = dict(self.terms)
        for n, p in other.terms:
            if powers.get(n, 0) < p:
                return None
            powers[n] -= p
        if self.coeff % other.coeff:
            return None
        return _mk(powers, self.coeff // other.coeff)

    def evaluate(self, bindings: Mapping[str, int]) -> int:
        v = self.coeff
        for n, p in self.terms:
            try:
                v *= bindings[n] ** p
            except KeyError:
                raise ShapeError(f"symbolic dim {n!r} has no value bound") from None
        return v

    def __str__(self) -> str:
        parts = [n if p == 1 else f"{n}^{p}" for n, p in self.terms]
        if self.coeff != 1:
            parts.insert(0, str(self.coeff))
        return "*".join(parts)

    def __repr__(self) -> str:
        return f"Sym({str(self)!r})"


def _canonical(terms: tuple[object, ...]) -> bool:
    """Whether ``terms`` are already valid and in canonical order (sorted unique names)."""
    prev = ""
    for t in terms:
        if type(t) is not tuple or len(t) != 2:
            return False
        n, p = t
        if type(n) is not str or type(p) is not int or p < 1 or n <= prev:
            return False
        if not n.isidentifier():
            return False
        prev = n
    return bool(terms)


def _check_int(v: object, what: str) -> int:
    if isinstance(v, bool) or not hasattr(v, "__index__") or int(v) < 1:  # type: ignore[call-overload]
        raise ShapeError(f"{what} must be an int >= 1, got {v!r}")
    return int(v)  # type: ignore[call-overload]


def _check_terms(terms: object, coeff: object) -> tuple[tuple[str, int], ...]:
    """``terms`` as sorted ``(name, power)`` pairs (repeated names multiply); ShapeError
    naming the bad term otherwise."""
    shown = f"Sym({terms!r}, {coeff!r})"
    if not isinstance(terms, tuple | list):
        raise ShapeError(
            f"{shown}: terms must be a symbol name or a tuple of (name, power) pairs; "
            'write Sym("seq"), sym("seq") or g.sym("seq")'
        )
    if not terms:
        raise ShapeError(f"{shown}: a symbolic dim needs at least one symbol (use an int)")
    powers: dict[str, int] = {}
    for t in terms:
        ok = isinstance(t, tuple | list) and len(t) == 2 and isinstance(t[0], str)
        if not ok:
            raise ShapeError(f"{shown}: term {t!r} is not a (name, power) pair")
        name, p = t
        if not name.isidentifier():
            raise ShapeError(f"{shown}: symbolic dim name must be an identifier, got {name!r}")
        powers[name] = powers.get(name, 0) + _check_int(p, f"{shown}: power of {name!r}")
    return tuple(sorted(powers.items()))


def check_bounds(name: object, lo: object, hi: object) -> tuple[int, int | None]:
    """Validated bounds ``lo <= value <= hi`` (``hi`` None: unbounded) of symbolic dim
    ``name``: an identifier, ints, ``0 <= lo <= hi``; ShapeError naming the dim otherwise."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"symbolic dim name must be an identifier, got {name!r}")
    if isinstance(lo, bool) or not isinstance(lo, int) or lo < 0:
        raise ShapeError(f"symbolic dim {name!r}: min must be an int >= 0, got {lo!r}")
    if hi is not None and (isinstance(hi, bool) or not isinstance(hi, int)):
        raise ShapeError(f"symbolic dim {name!r}: max must be an int or None, got {hi!r}")
    if hi is not None and hi < lo:
        raise ShapeError(f"symbolic dim {name!r}: max {hi} < min {lo}")
    return lo, hi


def _mk(powers: dict[str, int], coeff: int) -> Dim:
    terms = tuple(sorted((n, p) for n, p in powers.items() if p))
    if not terms:
        return coeff
    return Sym(terms, coeff)


Dim = int | Sym


def sym(name: str) -> Sym:
    """A fresh symbolic dim named ``name`` (e.g. ``sym("batch")``)."""
    return Sym.named(name)


def dim_str(d: Dim) -> str:
    return str(d)


def _as_dim(d: object) -> Dim:
    if isinstance(d, Sym):
        return d
    if isinstance(d, str):
        return Sym.named(d)
    if isinstance(d, (int,)) or hasattr(d, "__index__"):
        v = int(d)  # type: ignore[call-overload]
        if v < 0:
            raise ShapeError(f"dims must be >= 0, got {v}")
        return v
    raise ShapeError(f"a dim must be an int, a Sym or a symbol name, got {d!r}")


def dims_product(dims: Iterable[Dim]) -> Dim:
    out: Dim = 1
    for d in dims:
        if isinstance(out, int) and isinstance(d, int):
            out = out * d
        elif isinstance(out, int):
            out = d * out  # type: ignore[operator]
        else:
            out = out * d
    return out


@dataclass(frozen=True, slots=True, init=False)
class Shape:
    """Tensor type: a tuple of dims and a dtype. ``Shape((2, "seq"), DType.F32)``."""

    dims: tuple[Dim, ...]
    dtype: DType

    def __init__(self, dims: Iterable[object] = (), dtype: DType | str = DType.F32):
        object.__setattr__(self, "dims", tuple(_as_dim(d) for d in dims))
        object.__setattr__(self, "dtype", DType.parse(dtype))

    @property
    def rank(self) -> int:
        """The number of dims."""
        return len(self.dims)

    ndim = rank

    @property
    def is_static(self) -> bool:
        """True when every dim is an int (no symbolic dim)."""
        return all(isinstance(d, int) for d in self.dims)

    @property
    def symbols(self) -> frozenset[str]:
        """The names of the symbolic dims this shape uses."""
        return frozenset(n for d in self.dims if isinstance(d, Sym) for n in d.names)

    @property
    def numel(self) -> Dim:
        """The element count: an int, or a Sym for symbolic shapes."""
        return dims_product(self.dims)

    def with_dtype(self, dtype: DType) -> Shape:
        """The same dims with ``dtype``."""
        return Shape(self.dims, dtype)

    def with_dims(self, dims: Iterable[object]) -> Shape:
        """The same dtype with ``dims``."""
        return Shape(dims, self.dtype)

    def concrete(self, bindings: Mapping[str, int] | None = None) -> tuple[int, ...]:
        """Static dims with every symbol evaluated from ``bindings``."""
        if self.is_static:
            return self.dims  # type: ignore[return-value]
        b = bindings or {}
        return tuple(d if isinstance(d, int) else d.evaluate(b) for d in self.dims)

    def nbytes(self, bindings: Mapping[str, int] | None = None) -> int:
        """The byte size, with symbolic dims bound from ``bindings``."""
        return math.prod(self.concrete(bindings)) * self.dtype.itemsize

    def axis(self, a: int) -> int:
        """Normalise a possibly negative axis; ShapeError when out of range."""
        r = self.rank
        if not -r <= a < max(r, 1):
            raise ShapeError(f"axis {a} out of range for rank-{r} shape {self}")
        return a % r if r else 0

    def __len__(self) -> int:
        return len(self.dims)

    def __getitem__(self, i: int) -> Dim:
        return self.dims[i]

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(str(d) for d in self.dims)}]"

    def __repr__(self) -> str:
        return f"Shape({str(self)})"


def broadcast_dims(*shapes: Sequence[Dim]) -> tuple[Dim, ...]:
    """NumPy broadcasting of dim tuples; a symbolic dim broadcasts only against 1 or itself."""
    rank = max((len(s) for s in shapes), default=0)
    out: list[Dim] = []
    for i in range(rank):
        cur: Dim = 1
        for s in shapes:
            j = i - (rank - len(s))
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if cur == 1 or cur == d:
                cur = d
                continue
            raise ShapeError(
                "shapes "
                + " and ".join("[" + ",".join(map(str, s)) + "]" for s in shapes)
                + f" do not broadcast: dim {i} is {cur} vs {d}"
            )
        out.append(cur)
    return tuple(out)
