"""``rlx.jit``: trace a Python function of arrays once per input signature, compile it for
the CPU, and call the compiled graph afterwards.

In: a function of pytrees of arrays (NumPy arrays, NumPy or Python scalars), optional
``static_argnums`` (hashable arguments the trace depends on), ``dynamic`` (argument name
-> {axis: symbol name}: those dims are symbolic, so one compile serves every size) and
``num_threads`` / ``options`` (``CompileOptions``). Out: a callable returning the
function's output pytree of NumPy arrays.

Writable arrays are graph Inputs, copied into the compiled graph's arena on every call.
Read-only arrays (``rlx.freeze(params)``, or ``a.flags.writeable = False``) are weights:
graph Params, set when a new array object arrives and otherwise left in place (no copy;
the CPU backend packs a weight once per set), as ``jax.device_put`` arrays are for
``jax.jit``. Read-only is a promise not to change the values (a read-only view of
writable memory is set again on every call, since it could change).

The signature of a call is the tree structure, each leaf's dims (a symbol name for a
dynamic axis) and dtype, and the static arguments. A new signature traces the function
(:mod:`rlx.frontends.trace.tracer`) into a MIR graph whose Inputs are named after the
argument paths (``params.w1``) and compiles it with ``Session("cpu")`` (its compile cache
is shared); a known signature goes straight to the compiled graph. ``f.lower(*args)``
traces without compiling and returns a :class:`Lowered` (``.graph``, ``.inspect()``,
``.compile()``). A jitted function called while another function is being traced is
inlined into that trace.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx import source
from rlx.backends.cpu.memory import safe_to_share
from rlx.dtype import DType
from rlx.errors import TraceError
from rlx.frontends.trace import pytree
from rlx.frontends.trace.tracer import Trace, current, lift, tracing
from rlx.frontends.trace.values import Traced
from rlx.ir.mir import Graph
from rlx.options import CompileOptions
from rlx.shape import Shape, Sym

__all__ = ["jit", "Jitted", "Lowered", "freeze"]

_SCALAR = {bool: DType.BOOL, int: DType.I32, float: DType.F32, complex: DType.C64}


def _err(msg: str) -> TraceError:
    return TraceError(msg, loc=source.capture())


class Lowered:
    """A traced function before compilation: ``graph`` (MIR), ``inspect()`` (its text),
    ``compile()`` (a ``CompiledGraph`` with named inputs, the leaves in order)."""

    def __init__(self, graph: Graph, out_tree: Any, options: CompileOptions):
        self.graph = graph
        self.out_tree = out_tree
        self.options = options

    def inspect(self) -> str:
        """The MIR listing (``graph.inspect()``)."""
        return self.graph.inspect()

    def compile(self) -> Any:
        """Compile the graph with ``Session("cpu")``; returns the ``CompiledGraph``."""
        from rlx.runtime.session import Session

        return Session("cpu").compile(self.graph, self.options)

    def __repr__(self) -> str:
        return f"<Lowered {self.graph.name!r}: {len(self.graph)} nodes>"


class _Entry:
    """One compiled signature: the compiled graph, its input names, the output tree, and
    ``call(leaves)``, the steady-state path (the cache key already checked every leaf's
    dtype and static dims, so the compiled graph runs without its own input checks).
    Frozen leaves are params: set again only when another array object comes (or always,
    for a read-only view of writable memory, which could change behind our back)."""

    __slots__ = ("lowered", "compiled", "names", "call")

    def __init__(
        self,
        lowered: Lowered,
        names: list[str],
        dyn: list[tuple[int, int, str]],
        scalars: list[int],
        frozen: list[int],
    ):
        self.lowered = lowered
        self.names = names
        self.compiled = cg = lowered.compile()
        out_tree = lowered.out_tree
        run = cg.run_trusted
        inputs = {n.op.name: n for n in lowered.graph.input_nodes()}  # type: ignore[attr-defined]
        dtypes = {k: inputs[names[k]].shape.dtype.np for k in scalars}
        fset = set(frozen)
        feed_ix = [(names[k], k) for k in range(len(names)) if k not in fset]
        params = [(names[k], k) for k in frozen]
        bound: list[Any] = [None] * len(params)  # the array each param holds now
        shared = [False] * len(params)  # ... and whether it cannot change
        single = out_tree == pytree.LEAF
        bounds = lowered.graph.sym_bounds
        empty: dict[str, int] = {}

        def bind(leaves: list[Any]) -> None:
            for j, (name, k) in enumerate(params):
                a = leaves[k]
                if a is not bound[j] or not shared[j]:
                    cg.set_param(name, a)
                    bound[j], shared[j] = a, safe_to_share(a)

        lock = threading.Lock()  # a param set and the run that reads it stay together

        if not dyn and not scalars:

            def call(leaves: list[Any]) -> Any:
                feed = {n: leaves[k] for n, k in feed_ix}
                if params:
                    with lock:
                        bind(leaves)
                        outs = run(feed, empty)
                else:
                    outs = run(feed, empty)
                return outs[0] if single else pytree.unflatten(out_tree, outs)

        else:

            def call(leaves: list[Any]) -> Any:
                for k in scalars:
                    leaves[k] = _scalar(leaves[k], dtypes[k], names[k])
                bindings = _bind(leaves, dyn, names, bounds)
                feed = {n: leaves[k] for n, k in feed_ix}
                with lock:
                    if params:
                        bind(leaves)
                    outs = run(feed, bindings)
                return outs[0] if single else pytree.unflatten(out_tree, outs)

        self.call = call


def _leaf_key(leaf: Any, dyn_axes: Mapping[int, str] | None) -> tuple[Any, ...]:
    """A leaf's part of the cache key: dims (a symbol name on a dynamic axis), dtype and
    whether it is frozen for an array; the type for a Python scalar."""
    if isinstance(leaf, np.ndarray):
        dims: tuple[Any, ...] = leaf.shape
        if dyn_axes:
            dims = tuple(dyn_axes.get(a, d) for a, d in enumerate(dims))
        return (dims, leaf.dtype, leaf.flags.writeable)
    t = type(leaf)
    if t in _SCALAR:
        return ("weak", t)
    if isinstance(leaf, np.generic):
        return ((), leaf.dtype)
    if isinstance(leaf, Traced):
        raise _err("a traced value reached a jitted function outside of any trace")
    return ("?", t)


def _flat_keyed(tree: Any, leaves: list[Any], keys: list[Any]) -> Any:
    """``pytree.flatten`` that also appends each leaf's part of the cache key to ``keys``
    (for a NumPy array its shape, dtype and writeable flag, inline: the steady-state case;
    the tree tags are the container types, not ``pytree``'s)."""
    t = type(tree)
    if t is tuple or t is list:
        sub = []
        for x in tree:
            if type(x) is np.ndarray:
                leaves.append(x)
                keys.append(x.shape)
                keys.append(x.dtype)
                keys.append(x.flags.writeable)
                sub.append(pytree.LEAF)
            else:
                sub.append(_flat_keyed(x, leaves, keys))
        return (t, tuple(sub))
    if t is np.ndarray:
        leaves.append(tree)
        keys.append(tree.shape)
        keys.append(tree.dtype)
        keys.append(tree.flags.writeable)
        return pytree.LEAF
    if t is dict or tree is None or isinstance(tree, tuple):
        n = len(leaves)
        d = pytree.flatten(tree, leaves)[1]
        for x in leaves[n:]:
            keys.append(_leaf_key(x, None))
        return d
    leaves.append(tree)
    keys.append(_leaf_key(tree, None))
    return pytree.LEAF


def _frozen(leaf: Any) -> bool:
    """A read-only NumPy array argument: bound as a param (weights)."""
    return isinstance(leaf, np.ndarray) and not leaf.flags.writeable


def freeze(tree: Any) -> Any:
    """``tree`` with every NumPy array leaf replaced by a read-only copy (other leaves as
    they are): pass weights to a jitted function this way and they are bound as params,
    set once per array object instead of copied in on every call (see :func:`jit`)."""
    leaves, treedef = pytree.flatten(tree)
    out = []
    for x in leaves:
        if isinstance(x, np.ndarray):
            x = np.array(x, order="C", copy=True)
            x.flags.writeable = False
        out.append(x)
    return pytree.unflatten(treedef, out)


def _scalar(v: Any, dtype: np.dtype, name: str) -> np.ndarray:
    """A Python scalar argument as a rank-0 array of its input's dtype."""
    try:
        arr = np.asarray(v, dtype=dtype)
    except OverflowError:
        raise _err(f"argument {name!r}: {v!r} does not fit its dtype {dtype}") from None
    if arr.dtype.kind in "iu" and arr != v:
        raise _err(f"argument {name!r}: {v!r} does not fit its dtype {dtype}")
    return arr


def _bind(
    leaves: list[Any],
    dyn: list[tuple[int, int, str]],
    names: list[str],
    bounds: Mapping[str, tuple[int, int | None]],
) -> dict[str, int]:
    """The symbol values the dynamic axes of ``leaves`` give; TraceError on a conflict or
    a size outside the symbol's bounds."""
    out: dict[str, int] = {}
    for k, ax, sym in dyn:
        v = leaves[k].shape[ax]
        old = out.setdefault(sym, v)
        if old != v:
            first = next(names[j] for j, a, s in dyn if s == sym)
            raise _err(
                f"argument {names[k]!r}: dynamic dim {sym!r} (axis {ax}) is {v} but "
                f"{old} in argument {first!r}"
            )
        lo, hi = bounds.get(sym, (1, None))
        if v < lo or (hi is not None and v > hi):
            raise _err(
                f"argument {names[k]!r}: dynamic dim {sym!r} (axis {ax}) is {v}, outside "
                f"its bounds [{lo}, {hi if hi is not None else 'inf'}]"
            )
    return out


class Jitted:
    """A function compiled by :func:`jit` (see the module docstring)."""

    def __init__(
        self,
        fun: Callable[..., Any],
        static_argnums: int | Sequence[int] = (),
        dynamic: Mapping[str, Mapping[int, str]] | None = None,
        num_threads: int | None = None,
        options: CompileOptions | None = None,
    ):
        if not callable(fun):
            raise _err(f"rlx.jit needs a function, given {type(fun).__name__} {fun!r:.60}")
        functools.update_wrapper(self, fun)
        self.fun = fun
        sn = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnums = frozenset(int(i) for i in sn)
        try:
            params = list(inspect.signature(fun).parameters.values())
        except (TypeError, ValueError):
            params = []
        self._arg_names = [
            p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        self._check_dynamic(dynamic or {})
        self.dynamic = {k: dict(v) for k, v in (dynamic or {}).items()}
        opts = options or CompileOptions()
        if num_threads is not None:
            opts = opts.replace(num_threads=num_threads)
        self.options = opts
        self._cache: dict[Hashable, _Entry] = {}
        self._plain = not self.static_argnums and not self.dynamic
        self.trace_count = 0

    def _check_dynamic(self, dynamic: Mapping[str, Mapping[int, str]]) -> None:
        for name, axes in dynamic.items():
            if name not in self._arg_names:
                raise _err(
                    f"rlx.jit(dynamic=...): {getattr(self.fun, '__name__', 'the function')} has "
                    f"no positional argument {name!r}; its arguments: {self._arg_names}"
                )
            if not isinstance(axes, Mapping) or not all(
                isinstance(a, int) and isinstance(s, str) and s for a, s in axes.items()
            ):
                raise _err(
                    f"rlx.jit(dynamic=...): {name!r} must map axis (int) -> symbol name "
                    f"(str), e.g. {{0: 'batch'}}; given {axes!r}"
                )

    # ---- signature --------------------------------------------------------------------

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        """(dynamic part as a pytree, static values, argument names of the dynamic part)."""
        if kwargs:
            args = self._bind(args, kwargs)
        dyn, static, names = [], [], []
        for i, a in enumerate(args):
            if i in self.static_argnums:
                try:
                    hash(a)
                except TypeError:
                    raise _err(
                        f"static argument {i} must be hashable (it is part of the cache key), "
                        f"given {type(a).__name__}"
                    ) from None
                static.append((i, a))
            else:
                dyn.append(a)
                names.append(self._arg_names[i] if i < len(self._arg_names) else f"arg{i}")
        return tuple(dyn), tuple(static), names

    def _bind(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        sig = inspect.signature(self.fun)
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError as e:
            raise _err(f"{self.fun.__name__}: {e}") from None
        ba.apply_defaults()
        if ba.kwargs:
            raise _err(
                f"{self.fun.__name__}: rlx.jit passes arguments by position; keyword-only "
                f"arguments {sorted(ba.kwargs)} are not supported (make them positional)"
            )
        return tuple(ba.args)

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        dyn, static, names = self._split(args, kwargs)
        leaves: list[Any] = []
        trees, owners = [], []
        for k, a in enumerate(dyn):
            n0 = len(leaves)
            _, tree = pytree.flatten(a, leaves)
            trees.append(tree)
            owners.extend([k] * (len(leaves) - n0))
        dmaps = [self.dynamic.get(n) for n in names]
        key = (
            tuple(trees),
            static,
            tuple(_leaf_key(x, dmaps[o]) for x, o in zip(leaves, owners)),
        )
        return key, leaves, dyn, static, names, trees, owners

    # ---- calling ------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if current() is not None:  # inside another trace: inline
            return self.fun(*args, **kwargs)
        plain = not kwargs and self._plain
        if plain:  # the steady-state path: one pass for the leaves and the key
            leaves: list[Any] = []
            keys: list[Any] = []
            key = (_flat_keyed(args, leaves, keys), tuple(keys))
            entry = self._cache.get(key)
            if entry is not None:
                return entry.call(leaves)
        sig = self._signature(args, kwargs)
        entry = self._cache.get(sig[0])
        if entry is None:
            entry = self._compile(sig)
            if plain:
                self._cache[key] = entry
        return entry.call(sig[1])

    def _compile(self, sig: tuple[Any, ...]) -> _Entry:
        key, leaves, dyn, static, names, trees, owners = sig
        lowered, input_names, dyn_list = self._trace(leaves, dyn, static, names, trees, owners)
        scalars = [k for k, x in enumerate(leaves) if type(x) in _SCALAR]
        frozen = [k for k, x in enumerate(leaves) if _frozen(x)]
        entry = _Entry(lowered, input_names, dyn_list, scalars, frozen)
        self._cache[key] = entry
        return entry

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """Trace for these arguments (no compile): a :class:`Lowered`."""
        key, leaves, dyn, static, names, trees, owners = self._signature(args, kwargs)
        return self._trace(leaves, dyn, static, names, trees, owners)[0]

    def _trace(self, leaves: list[Any], dyn: tuple[Any, ...], static: tuple[Any, ...],
               names: list[str], trees: list[Any], owners: list[int]) -> tuple[Any, ...]:  # fmt: skip
        self.trace_count += 1
        t = Trace(getattr(self.fun, "__name__", "jit"))
        paths: list[str] = []
        for name, tree in zip(names, trees):
            paths.extend(pytree.paths(tree, name))
        dyn_list: list[tuple[int, int, str]] = []
        with tracing(t):
            vals = []
            for k, (leaf, path) in enumerate(zip(leaves, paths)):
                axes = self.dynamic.get(names[owners[k]]) or {}
                vals.append(self._input(t, leaf, path, axes, k, dyn_list))
            it = iter(vals)
            dyn_args = [pytree.unflatten(tree, it) for tree in trees]
            full: list[Any] = []
            di = iter(dyn_args)
            sd = dict(static)
            for i in range(len(dyn_args) + len(static)):
                full.append(sd[i] if i in sd else next(di))
            out = self.fun(*full)
            out_leaves, out_tree = pytree.flatten(out)
            ids = [lift(t, o).id for o in out_leaves]
        t.g.set_outputs(ids)
        return Lowered(t.g, out_tree, self.options), paths, dyn_list

    def _input(self, t: Trace, leaf: Any, path: str, axes: Mapping[int, str], k: int,
               dyn_list: list[tuple[int, int, str]]) -> Traced:  # fmt: skip
        ty = type(leaf)
        if ty in _SCALAR:
            return t.input(path, Shape((), _SCALAR[ty]), weak=True)
        if not isinstance(leaf, np.ndarray | np.generic):
            raise _err(
                f"argument {path!r} of {self.fun.__name__} is a {ty.__name__}; rlx.jit traces "
                "NumPy arrays and Python scalars in tuples, lists and dicts (mark other "
                "arguments static with static_argnums)"
            )
        arr = np.asarray(leaf)
        dtype = DType.from_numpy(arr.dtype)
        dims: list[Any] = list(arr.shape)
        for a, sname in axes.items():
            if not -arr.ndim <= a < arr.ndim:
                raise _err(
                    f"dynamic axis {a} of {path!r} is out of range for its shape {arr.shape}"
                )
            if sname not in t.g.sym_bounds:
                t.g.sym(sname)
            dims[a % arr.ndim] = Sym.named(sname)
            dyn_list.append((k, a % arr.ndim, sname))
        if _frozen(leaf):
            return t.wrap(t.g.param(path, Shape(tuple(dims), dtype)))
        return t.input(path, Shape(tuple(dims), dtype))

    def cache_size(self) -> int:
        """How many signatures have a compiled graph."""
        return len({id(e) for e in self._cache.values()})

    def __repr__(self) -> str:
        return f"<rlx.jit of {getattr(self.fun, '__qualname__', self.fun)!r}>"


def jit(
    fun: Callable[..., Any] | None = None,
    *,
    static_argnums: int | Sequence[int] = (),
    dynamic: Mapping[str, Mapping[int, str]] | None = None,
    num_threads: int | None = None,
    options: CompileOptions | None = None,
) -> Any:
    """Trace ``fun`` on first call per signature, compile it for the CPU, and run the
    compiled graph afterwards; ``@rlx.jit`` or ``rlx.jit(f, static_argnums=...,
    dynamic={"x": {0: "batch"}}, num_threads=...)``. Returns a :class:`Jitted`."""
    if fun is None:
        return lambda f: Jitted(f, static_argnums, dynamic, num_threads, options)
    return Jitted(fun, static_argnums, dynamic, num_threads, options)
