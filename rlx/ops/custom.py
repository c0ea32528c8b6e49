"""Custom ops: user-defined ops registered by name at run time, without a new class.

``register_custom_op(name, infer, reference)`` records an entry; ``Custom(name, attributes)``
(built with ``g.custom(name, inputs, **attrs)``) is the one registered op class that looks
the entry up and delegates to it:

* ``infer(ins: tuple[Shape, ...], attrs: Mapping[str, Any]) -> Shape``
* ``reference(xs: Sequence[np.ndarray], attrs: Mapping[str, Any], ctx: RefCtx) -> ndarray``

Attributes are hashable values (ints, floats, bools, strings, None, tuples, DTypes,
Shapes and rlx enums / frozen dataclasses: what files can hold). A name that is not
registered is an error when the node is built and when a saved graph is loaded: register
custom ops before loading graphs that use them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from rlx.errors import RlxError, ShapeError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import Op, OpKind, RefCtx, graph_method, register
from rlx.shape import Shape

__all__ = [
    "CustomOpDef",
    "Custom",
    "register_custom_op",
    "unregister_custom_op",
    "custom_op",
    "custom_op_names",
]

InferFn = Callable[[tuple[Shape, ...], Mapping[str, Any]], Shape]
ReferenceFn = Callable[[Sequence[np.ndarray], Mapping[str, Any], RefCtx], np.ndarray]


@dataclass(frozen=True, slots=True)
class CustomOpDef:
    """A registry entry: the functions and facts a :class:`Custom` node delegates to."""

    name: str
    infer: InferFn
    reference: ReferenceFn
    arity: int | None
    kind: OpKind


_REGISTRY: dict[str, CustomOpDef] = {}


def register_custom_op(
    name: str,
    infer: InferFn,
    reference: ReferenceFn,
    arity: int | None = None,
    kind: OpKind = OpKind.COMPUTE,
    *,
    replace: bool = False,
) -> CustomOpDef:
    """Register custom op ``name`` and return its registry entry.

    ``infer(input_shapes, attrs) -> Shape`` is the shape/dtype rule (raise ShapeError to
    reject inputs); ``reference(arrays, attrs, ctx) -> np.ndarray`` computes the output
    with NumPy. ``attrs`` are the keyword arguments given to ``g.custom(name, inputs,
    **attrs)``. ``arity=None`` accepts any number of inputs; ``kind`` is the precision class
    for mixed precision. Registering a taken name raises ShapeError unless ``replace=True``.
    """
    if not isinstance(name, str) or not name.isidentifier():
        raise ShapeError(f"custom op name must be an identifier, got {name!r}")
    if name in _REGISTRY and not replace:
        raise ShapeError(
            f"custom op {name!r} is already registered (pass replace=True to redefine it)"
        )
    if not callable(infer) or not callable(reference):
        raise ShapeError(f"custom op {name!r}: infer and reference must be callables")
    if arity is not None and (not isinstance(arity, int) or isinstance(arity, bool) or arity < 0):
        raise ShapeError(f"custom op {name!r}: arity must be None or an int >= 0, got {arity!r}")
    if not isinstance(kind, OpKind):
        raise ShapeError(f"custom op {name!r}: kind must be an OpKind, got {kind!r}")
    entry = CustomOpDef(name, infer, reference, arity, kind)
    _REGISTRY[name] = entry
    return entry


def unregister_custom_op(name: str) -> None:
    """Remove ``name`` from the registry (ShapeError when it is not registered)."""
    custom_op(name)
    del _REGISTRY[name]


def custom_op_names() -> list[str]:
    """The registered custom op names, sorted."""
    return sorted(_REGISTRY)


def custom_op(name: str) -> CustomOpDef:
    """The registry entry of ``name``; ShapeError listing the registered names if none."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ShapeError(
            f"custom op {name!r} is not registered (registered: {custom_op_names()}); "
            "call rlx.register_custom_op first"
        ) from None


class _EntryKind:
    """``Custom.kind``: the entry's OpKind on an instance, COMPUTE on the class."""

    def __get__(self, obj: Custom | None, owner: type) -> OpKind:
        if obj is None:
            return OpKind.COMPUTE
        return custom_op(obj.name).kind


@register
class Custom(Op):
    """A node of custom op ``name`` with ``attributes`` (``(key, value)`` pairs, sorted by
    the builder); shape rule, reference, arity and kind come from the registry entry."""

    mnemonic: ClassVar[str] = "custom"
    kind = _EntryKind()  # type: ignore[assignment]
    name: str
    # named ``attributes``, not ``attrs``: ``Op.attrs()`` is the method every op answers
    attributes: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        custom_op(self.name)
        keys = [k for k, _ in self.attributes]
        if any(not isinstance(k, str) or not k.isidentifier() for k in keys):
            raise ShapeError(
                f"custom op {self.name!r}: attribute names must be identifiers, got {keys}"
            )
        if len(set(keys)) != len(keys):
            raise ShapeError(f"custom op {self.name!r}: duplicate attribute names in {keys}")
        try:
            hash(self.attributes)
        except TypeError as e:
            raise ShapeError(
                f"custom op {self.name!r}: attribute values must be hashable ({e})"
            ) from None

    @property
    def attr_map(self) -> Mapping[str, Any]:
        """The attributes as a read-only mapping."""
        return MappingProxyType(dict(self.attributes))

    def num_inputs(self) -> int | None:
        return custom_op(self.name).arity

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        entry = custom_op(self.name)
        try:
            out = entry.infer(ins, self.attr_map)
        except RlxError:
            raise
        except Exception as e:
            raise ShapeError(
                f"custom op {self.name!r}: its infer raised {type(e).__name__}: {e}"
            ) from e
        if not isinstance(out, Shape):
            raise ShapeError(
                f"custom op {self.name!r}: infer must return a Shape, returned {out!r}"
            )
        return out

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        try:
            out = np.asarray(custom_op(self.name).reference(xs, self.attr_map, ctx))
        except RlxError:
            raise
        except Exception as e:
            raise RlxError(
                f"custom op {self.name!r}: its reference raised {type(e).__name__}: {e}"
            ) from e
        if tuple(out.shape) != ctx.out_dims:
            raise ShapeError(
                f"custom op {self.name!r}: reference returned shape {tuple(out.shape)} "
                f"but its infer gives {ctx.out_dims}"
            )
        return out

    def attrs_str(self) -> str:
        return ", ".join([f"name={self.name}", *(f"{k}={v!r}" for k, v in self.attributes)])


@graph_method
def custom(g: Graph, name: str, inputs: Sequence[NodeId] = (), **attrs: Any) -> NodeId:
    """A node of registered custom op ``name`` over ``inputs`` with keyword attributes."""
    items = tuple(sorted((k, tuple(v) if isinstance(v, list) else v) for k, v in attrs.items()))
    return g.apply(Custom(name, items), list(inputs))
