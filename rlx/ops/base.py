"""The op registry: every op is one frozen dataclass holding all its facets.

An op class defines, side by side:

* its attributes (dataclass fields: ints, floats, tuples, enums; all hashable),
* ``arity`` (a ClassVar) or ``num_inputs()`` for ops whose input count depends on attributes,
* ``infer(ins) -> Shape``: the shape/dtype rule (raises ShapeError with a full sentence),
* ``reference(xs, ctx) -> np.ndarray``: the NumPy oracle,
* ``kind``: its precision class (OpKind, used by auto mixed precision),
* flags: ``elementwise`` (fusable into an ElementwiseRegion), ``pure`` (CSE-able),
  ``view`` (output aliases input 0's bytes, e.g. reshape).

``@register`` turns the class into a frozen, slotted dataclass and records it under its
``mnemonic``. Passes query flags (``op.elementwise``), never lists of op names.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, dataclass_transform

import numpy as np

from rlx.errors import ShapeError
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node

__all__ = [
    "Op",
    "OpKind",
    "RefCtx",
    "register",
    "OPS",
    "op_class",
    "graph_method",
    "expect",
    "registry_scope",
    "format_attrs",
]


def format_attrs(attrs: Mapping[str, Any]) -> str:
    """``k=v, ...`` as the IR printers show attributes: enums by lower-case name, floats
    with ``:g``."""
    parts = []
    for k, v in attrs.items():
        if isinstance(v, enum.Enum):
            v = v.name.lower()
        elif isinstance(v, float):
            v = f"{v:g}"
        parts.append(f"{k}={v}")
    return ", ".join(parts)


class OpKind(enum.Enum):
    """Precision class of an op, as in the seed's precision pass."""

    COMPUTE = "compute"
    REDUCTION = "reduction"
    ELEMENTWISE = "elementwise"
    DATA_MOVEMENT = "data_movement"
    BOUNDARY = "boundary"


@dataclass(frozen=True, slots=True)
class RefCtx:
    """What a reference implementation may need besides its inputs."""

    out_dims: tuple[int, ...]
    out_dtype: np.dtype
    bindings: Mapping[str, int]
    params: Mapping[str, np.ndarray]
    inputs: Mapping[str, np.ndarray]


class Op:
    """Base of every op. Subclasses are registered with :func:`register`."""

    __slots__ = ()
    mnemonic: ClassVar[str] = "op"
    arity: ClassVar[int | None] = None
    kind: ClassVar[OpKind] = OpKind.COMPUTE
    elementwise: ClassVar[bool] = False
    pure: ClassVar[bool] = True
    # the output is input 0's bytes reinterpreted (same byte count, contiguous): the
    # memory planner makes it a view instead of a copy
    view: ClassVar[bool] = False
    # inputs a precision policy never narrows (they keep their dtype, e.g. attention's
    # additive mask, whose f32 finfo.min would overflow to -inf in f16/bf16)
    keep_dtype_inputs: ClassVar[tuple[int, ...]] = ()
    # autodiff (rlx/autodiff): why the op has no derivative ("integer output", "comparison",
    # "quantize: piecewise constant"); empty when it defines ``vjp`` and ``jvp``
    nondiff: ClassVar[str] = ""
    # the op writes state (a param's storage) when it runs: never removed, never CSE'd,
    # scheduled after every other node (rlx/train's ``assign``)
    effect: ClassVar[bool] = False

    def num_inputs(self) -> int | None:
        """Exact number of inputs, or None for variadic ops (checked by ``infer``)."""
        return self.arity

    def infer(self, ins: tuple[Shape, ...]) -> Shape:  # pragma: no cover - abstract
        raise NotImplementedError

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    # ---- derivative and batching rules (rlx/autodiff drives them) ------------------
    # ``g`` is the graph being extended (the forward graph's nodes are in it), ``node`` the
    # forward node; rules add nodes with the graph builders (``g.mul``, ``g.apply``) and may
    # use the helpers of ``rlx.ops.rules`` (``unbroadcast``, ``zeros``).

    def vjp(self, g: Graph, node: Node, ct: int) -> tuple[int | None, ...]:
        """Reverse mode: the cotangent of each input, given ``ct``, the cotangent of the
        output (same shape and dtype as the output). ``None`` for an input that gets no
        gradient (integer inputs, indices, an input the output does not depend on)."""
        raise NotImplementedError

    def jvp(self, g: Graph, node: Node, tangents: tuple[int | None, ...]) -> int | None:
        """Forward mode: the output's tangent given the inputs' tangents (``None``: zero
        tangent). Returns None when the output's tangent is zero."""
        raise NotImplementedError

    def batch(
        self, g: Graph, node: Node, ins: tuple[int, ...], bdims: tuple[int | None, ...]
    ) -> tuple[int, int | None]:
        """vmap: the op applied to batched inputs ``ins`` (``bdims[i]``: the batch axis of
        input i, None when unbatched) -> (output id, its batch axis). The default raises
        NotImplementedError and the vmap driver falls back to its generic rules."""
        raise NotImplementedError

    def subgraphs(self) -> tuple[Graph, ...]:
        """Nested graphs (control flow); empty for ordinary ops."""
        return ()

    def attrs(self) -> dict[str, Any]:
        """Attribute name -> value, in declaration order."""
        return {f.name: getattr(self, f.name) for f in fields(self)}  # type: ignore[arg-type]

    def attrs_str(self) -> str:
        return format_attrs(self.attrs())

    def __str__(self) -> str:
        a = self.attrs_str()
        return f"{self.mnemonic}[{a}]" if a else self.mnemonic


OPS: dict[str, type[Op]] = {}
_CLASS_FACETS = frozenset(
    {"mnemonic", "arity", "kind", "elementwise", "pure", "view", "nondiff", "effect"}
)
T = TypeVar("T", bound=type[Op])


@dataclass_transform(frozen_default=True)
def register(cls: T) -> T:
    """Class decorator: make ``cls`` a frozen slotted dataclass and record it in OPS."""
    name = cls.__dict__.get("mnemonic")
    if not name:
        raise TypeError(f"op class {cls.__name__} needs a 'mnemonic' ClassVar")
    if name in OPS:
        raise TypeError(f"op mnemonic {name!r} registered twice ({OPS[name]} and {cls})")
    for facet in ("infer", "reference"):
        if getattr(cls, facet) is getattr(Op, facet):
            raise TypeError(f"op {name} lacks its {facet}() facet")
    dc = dataclass(frozen=True, slots=True, eq=True)(cls)
    facets = sorted({f.name for f in fields(dc)} & _CLASS_FACETS)  # type: ignore[arg-type]
    if facets:
        raise TypeError(
            f"op {name}: {', '.join(facets)} became dataclass fields; annotate them "
            "ClassVar[...] (with ClassVar imported at module level when the module uses "
            "'from __future__ import annotations')"
        )
    OPS[name] = dc
    return dc  # type: ignore[return-value]


def op_class(mnemonic: str) -> type[Op]:
    try:
        return OPS[mnemonic]
    except KeyError:
        raise ShapeError(f"unknown op {mnemonic!r}") from None


def expect(cond: bool, op: Op | str, msg: str) -> None:
    """Raise ShapeError(f'{op}: {msg}') unless ``cond``: the one way shape rules complain."""
    if not cond:
        name = op if isinstance(op, str) else op.mnemonic
        raise ShapeError(f"{name}: {msg}")


def graph_method(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Attach a builder convenience (``g.<name>(...)``) to Graph, next to the op it builds."""
    from rlx.ir.mir import Graph

    if hasattr(Graph, fn.__name__):
        raise TypeError(f"Graph.{fn.__name__} defined twice")
    setattr(Graph, fn.__name__, fn)
    return fn


@contextmanager
def registry_scope() -> Iterator[None]:
    """Undo, on exit, every registration made inside the block: op classes added to
    ``OPS``, builder methods attached to ``Graph`` and custom ops (``register_custom_op``).
    Registrations are process-global; tests and notebooks use this to keep them local.
    (Every built-in op registers when ``rlx`` is imported, so the scope only ever removes
    what user code added inside it.)"""
    from rlx.ir.mir import Graph
    from rlx.ops import custom

    ops = dict(OPS)
    graph_attrs = dict(Graph.__dict__)
    customs = dict(custom._REGISTRY)
    try:
        yield
    finally:
        OPS.clear()
        OPS.update(ops)
        for name in [n for n in Graph.__dict__ if n not in graph_attrs]:
            delattr(Graph, name)
        for name, value in graph_attrs.items():
            if Graph.__dict__.get(name) is not value and not name.startswith("__"):
                setattr(Graph, name, value)
        custom._REGISTRY.clear()
        custom._REGISTRY.update(customs)
