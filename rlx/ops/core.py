"""Boundary ops: graph inputs, params (weights) and constants; and ``stop_gradient``, the
identity with a zero derivative."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError, ShapeError
from rlx.ops.base import Op, OpKind, RefCtx, graph_method, register
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node, NodeId


@dataclass(frozen=True, slots=True)
class ConstValue:
    """An immutable, hashable array value (bytes + dims + dtype)."""

    data: bytes
    dims: tuple[int, ...]
    dtype: DType

    @staticmethod
    def of(value: Any, dtype: DType | None = None) -> ConstValue:
        arr = np.asarray(value)
        if dtype is None:
            if arr.dtype == np.float64 and not isinstance(value, np.ndarray):
                arr = arr.astype(np.float32)  # Python floats default to f32
            elif arr.dtype == np.int64 and not isinstance(value, np.ndarray):
                arr = arr.astype(np.int32) if arr.size else arr
            dtype = DType.from_numpy(arr.dtype)
        arr = np.array(arr, dtype=dtype.np, order="C")
        return ConstValue(arr.tobytes(), tuple(arr.shape), dtype)

    def array(self) -> np.ndarray:
        a = np.frombuffer(self.data, dtype=self.dtype.np).reshape(self.dims)
        return a

    def __repr__(self) -> str:
        a = self.array()
        if a.size <= 8:
            return np.array2string(a, separator=",").replace("\n", "")
        return f"<{self.dtype}{list(self.dims)}>"


@register
class Input(Op):
    """A named graph input fed at run time."""

    mnemonic: ClassVar[str] = "input"
    arity: ClassVar[int] = 0
    kind: ClassVar[OpKind] = OpKind.BOUNDARY
    pure: ClassVar[bool] = False
    name: str
    shape: Shape

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return self.shape

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        try:
            return ctx.inputs[self.name]
        except KeyError:
            raise InputError(f"input {self.name!r} was not given") from None


@register
class Param(Op):
    """A named parameter (weight), set once and read by every run."""

    mnemonic: ClassVar[str] = "param"
    arity: ClassVar[int] = 0
    kind: ClassVar[OpKind] = OpKind.BOUNDARY
    pure: ClassVar[bool] = False
    name: str
    shape: Shape

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return self.shape

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        try:
            return ctx.params[self.name]
        except KeyError:
            raise InputError(f"param {self.name!r} was never set") from None


@register
class Constant(Op):
    """A literal array embedded in the graph."""

    mnemonic: ClassVar[str] = "constant"
    arity: ClassVar[int] = 0
    kind: ClassVar[OpKind] = OpKind.BOUNDARY
    value: ConstValue

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return Shape(self.value.dims, self.value.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return self.value.array()


@register
class StopGradient(Op):
    """The identity whose derivative is zero (``jax.lax.stop_gradient``): reverse mode
    sends no cotangent to its input, forward mode no tangent out. A view: its output is
    the input's bytes."""

    mnemonic: ClassVar[str] = "stop_gradient"
    arity: ClassVar[int] = 1
    kind: ClassVar[OpKind] = OpKind.DATA_MOVEMENT
    view: ClassVar[bool] = True

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        return ins[0]

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        return xs[0]

    def vjp(self, g: Graph, node: Node, ct: NodeId) -> tuple[NodeId | None, ...]:
        return (None,)

    def jvp(self, g: Graph, node: Node, tangents: tuple[NodeId | None, ...]) -> NodeId | None:
        return None

    def batch(
        self, g: Graph, node: Node, ins: tuple[NodeId, ...], bdims: tuple[int | None, ...]
    ) -> tuple[NodeId, int | None]:
        return g.apply(self, [ins[0]]), bdims[0]


@graph_method
def stop_gradient(g: Graph, x: NodeId) -> NodeId:
    """``x`` as a constant to differentiation: same value, zero derivative."""
    return g.apply(StopGradient(), [x])


def _check_name(g: Graph, name: str, what: str) -> None:
    if not isinstance(name, str) or not name:
        raise ShapeError(f"{what} name must be a non-empty string, got {name!r}")
    for n in g.nodes:
        if isinstance(n.op, (Input, Param)) and n.op.name == name:
            raise ShapeError(f"{what} name {name!r} is already used by node %{n.id}")


@graph_method
def input(
    g: Graph, name: str, shape: Shape | Sequence[Any], dtype: DType | str | None = None
) -> NodeId:
    """Add a named input. ``shape`` is a Shape, or dims plus ``dtype`` (default f32)."""
    _check_name(g, name, "input")
    if not isinstance(shape, Shape):
        shape = Shape(shape, dtype or DType.F32)
    return g.apply(Input(name, shape))


@graph_method
def param(
    g: Graph, name: str, shape: Shape | Sequence[Any], dtype: DType | str | None = None
) -> NodeId:
    """Add a named parameter (weight)."""
    _check_name(g, name, "param")
    if not isinstance(shape, Shape):
        shape = Shape(shape, dtype or DType.F32)
    return g.apply(Param(name, shape))


@graph_method
def constant(g: Graph, value: Any, dtype: DType | str | None = None) -> NodeId:
    """Add a constant from an array or scalar (Python floats become f32)."""
    return g.apply(Constant(ConstValue.of(value, DType.parse(dtype) if dtype else None)))


def operand(g: Graph, v: Any, like: NodeId) -> NodeId:
    """A node id (int) as is; a float or NumPy scalar becomes a rank-0 constant with
    ``like``'s dtype (use ``g.constant`` for integer-valued constants: ints are node ids)."""
    if isinstance(v, bool) or isinstance(v, (float, np.generic)):
        return constant(g, np.asarray(v, dtype=g.node(like).dtype.np))
    if isinstance(v, int):
        return v
    raise ShapeError(f"expected a node id or a float scalar, got {v!r}")
