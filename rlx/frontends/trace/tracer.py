"""Traces: the graph a traced Python function is building, and how values enter it.

In: Python values met while tracing (traced values of this or an enclosing trace, NumPy
arrays, Python scalars). Out: :class:`~rlx.frontends.trace.values.Traced` values of the
current :class:`Trace`, whose ``g`` is an ordinary MIR :class:`~rlx.ir.mir.Graph`.

A trace is pushed while ``rlx.jit`` (or ``rlx.cond`` / ``while_loop`` / ``scan`` for
their bodies) runs the user's function. A body trace has a parent: a value of an
enclosing trace used in a body is *captured*, becoming an Input of the body graph that
the control-flow op feeds with the outer value (sub-graphs hold no params, so a closure
over an outer value is turned into an operand, as ``jax.lax`` does).

Weak types: a Python scalar has no dtype of its own; it takes the dtype of the tensor it
meets when its kind fits (bool < int < float < complex), else the default type of its
own kind (``i32``, ``f32``, ``c64``), as JAX's weakly-typed values do.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx import source
from rlx.dtype import DType, promote
from rlx.errors import TraceError
from rlx.ir.mir import Graph, NodeId
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.frontends.trace.values import Traced

__all__ = ["Trace", "current", "tracing", "find_trace", "lift", "result_type", "to_dtype"]

_KIND = {"b": 0, "u": 1, "i": 1, "f": 2, "V": 2, "c": 3}  # V: bf16 / fp8 (ml_dtypes)
_DEFAULT = {0: DType.BOOL, 1: DType.I32, 2: DType.F32, 3: DType.C64}


def kind_of(d: DType) -> int:
    """0 bool, 1 integer, 2 float, 3 complex."""
    if d.is_bool:
        return 0
    if d.is_int:
        return 1
    return 3 if d.is_complex else 2


def scalar_kind(v: Any) -> int | None:
    """The kind of a Python scalar (bool, int, float, complex), else None."""
    if isinstance(v, bool):
        return 0
    if isinstance(v, int):
        return 1
    if isinstance(v, float):
        return 2
    if isinstance(v, complex):
        return 3
    return None


def result_type(items: Sequence[tuple[DType, bool]]) -> tuple[DType, bool]:
    """The common (dtype, weak) of operands given as (dtype, weak) pairs: strong types
    promote by rlx's lattice; a weak operand takes the strong result when its kind fits,
    else the default type of its kind."""
    strong = [d for d, w in items if not w]
    weak = [d for d, w in items if w]
    if not strong:
        out = weak[0]
        for d in weak[1:]:
            out = promote(out, d)
        return out, True
    out = strong[0]
    for d in strong[1:]:
        out = promote(out, d)
    k = max((kind_of(d) for d in weak), default=0)
    if k > kind_of(out):
        out = _DEFAULT[k]
    return out, False


def to_dtype(dt: Any) -> DType:
    """A DType from a DType, an rlx name ('f32'), a NumPy dtype or type, or 'float32'."""
    if isinstance(dt, DType):
        return dt
    if isinstance(dt, str):
        try:
            return DType.parse(dt)
        except Exception:  # noqa: BLE001 - try NumPy's names next
            pass
    if dt is float:
        return DType.F32
    if dt is int:
        return DType.I32
    if dt is bool:
        return DType.BOOL
    try:
        return DType.from_numpy(np.dtype(dt))
    except TypeError:
        raise TraceError(f"not a dtype: {dt!r}", loc=source.capture()) from None


class Trace:
    """One graph being built by tracing; ``parent`` is the enclosing trace of a body."""

    def __init__(self, name: str, parent: Trace | None = None):
        self.g = Graph(name)
        self.parent = parent
        self.captures: list[Traced] = []  # parent values lifted in, in order
        self.capture_inputs: list[Traced] = []  # the Input each became here
        self._captured: dict[tuple[int, NodeId], Traced] = {}  # outer (trace, node) -> Input
        self.closed = False

    def wrap(self, nid: NodeId, weak: bool = False) -> Traced:
        from rlx.frontends.trace.values import Traced

        return Traced(self, nid, weak)

    def input(self, name: str, shape: Shape, weak: bool = False) -> Traced:
        """A new Input of this trace's graph."""
        return self.wrap(self.g.input(name, shape), weak)

    def constant(self, value: Any, dtype: DType | None = None) -> Traced:
        """A constant node (Python floats f32, ints i32 unless ``dtype``)."""
        if dtype is not None:
            value = np.asarray(value, dtype=dtype.np)
        return self.wrap(self.g.constant(value))

    def capture(self, v: Traced) -> Traced:
        """``v`` (a value of an enclosing trace) as an Input of this one."""
        key = (id(v.trace), v.id)
        got = self._captured.get(key)
        if got is not None:
            return got
        outer = v if v.trace is self.parent else self.parent.capture(v)  # type: ignore[union-attr]
        inner = self.input(f"cap{len(self.captures)}", v.trace.g.shape(v.id), v.weak)
        self.captures.append(outer)
        self.capture_inputs.append(inner)
        self._captured[key] = inner
        return inner

    def is_ancestor(self, other: Trace) -> bool:
        t = self.parent
        while t is not None:
            if t is other:
                return True
            t = t.parent
        return False


_STATE = threading.local()


def _stack() -> list[Trace]:
    s = getattr(_STATE, "stack", None)
    if s is None:
        s = _STATE.stack = []
    return s


def current() -> Trace | None:
    """The innermost trace being built on this thread, or None."""
    s = _stack()
    return s[-1] if s else None


@contextmanager
def tracing(t: Trace) -> Iterator[Trace]:
    """Make ``t`` the current trace for the block; it is closed afterwards."""
    s = _stack()
    s.append(t)
    try:
        yield t
    finally:
        s.pop()
        t.closed = True


def find_trace(*vals: Any) -> Trace:
    """The trace operands belong to: the current one (values of enclosing traces are
    captured by it). TraceError when nothing is being traced."""
    t = current()
    if t is not None:
        return t
    from rlx.frontends.trace.values import Traced

    for v in vals:
        if isinstance(v, Traced):
            raise TraceError(
                "a traced value was used after its function returned (it escaped the "
                "rlx.jit / cond / while_loop / scan function that made it)",
                loc=source.capture(),
            )
    raise TraceError(
        "rlx.numpy / rlx.nn functions build graphs: call them inside a function traced by "
        "rlx.jit (or a body of rlx.cond / while_loop / scan)",
        loc=source.capture(),
    )


def lift(t: Trace, v: Any, dtype: DType | None = None) -> Traced:
    """``v`` as a value of trace ``t``: traced values as they are (captured when they
    belong to an enclosing trace), Python scalars as weak constants (of ``dtype`` when
    given), arrays and lists as constants."""
    from rlx.frontends.trace.values import Traced

    if isinstance(v, Traced):
        if v.trace is t:
            return v
        if t.is_ancestor(v.trace) and not v.trace.closed:
            return t.capture(v)
        raise TraceError(
            "a traced value was used outside the trace that made it (a value of a finished "
            "rlx.jit / cond / while_loop / scan function, or of another thread's trace)",
            loc=source.capture(),
        )
    k = scalar_kind(v)
    if k is not None:
        d = dtype if dtype is not None else _DEFAULT[k]
        return t.wrap(t.g.constant(np.asarray(v, dtype=d.np)), weak=True)
    if isinstance(v, np.ndarray | np.generic):
        return t.wrap(t.g.constant(np.asarray(v)))
    try:
        arr = np.asarray(v)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.dtype == object:
        raise TraceError(
            f"cannot use a {type(v).__name__} as an array in a traced function: {v!r:.80}",
            loc=source.capture(),
        )
    if arr.dtype == np.float64:
        arr = arr.astype(np.float32)  # a Python float list is f32, as jnp.asarray makes it
    elif arr.dtype == np.int64:
        arr = arr.astype(np.int32)
    return t.wrap(t.g.constant(arr))
