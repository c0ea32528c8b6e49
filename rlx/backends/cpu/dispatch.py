"""The CPU kernel table. In: a node plus NumPy views of its input and output arena slots.
Out: a zero-argument closure that computes the node into its output view.

A *factory* ``(node, ins, out, ctx) -> Callable[[], None] | None`` builds the kernel of
one node. Each op's factories are tried in one order, written as one list in the kernel
module of the op's family: ``kernels/<family>.py`` (the same name as the op's
``rlx/ops/<family>.py``) ends with a table ``ATTEMPTS = {OpClass: (first, second, ...)}``.
The first factory that returns a kernel wins; a factory returns None when the node is not
its case (a complex input, an integer division, a layout its native path does not take:
it may leave a note in ``ctx.notes`` saying why), and the next one is tried. When every
attempt returns None the node gets the default kernel. A factory may raise
:class:`~rlx.errors.UnsupportedOpError`; the executor collects every such node and fails
the compile with one list. A factory's report kind is declared with ``@kind(...)``
(``numpy`` when undeclared) and set in ``ctx.kind`` before it is tried; the factory may
change it (a matmul on integers is not BLAS).

The default kernel (``reference_kernel``) calls the op's NumPy ``reference`` and copies the
result into the output view: it allocates a fresh array per call and is listed as
``reference`` in the report. Every op therefore runs; a kernel here only makes it faster.
Every built-in op has attempts (``tests/cpu/test_dispatch.py``): the reference kernel is
for custom ops.

Fast paths several families call (packed sgemm, the int8 GEMM, the bf16/f16 library,
generated regions and row kernels, direct convolution, BLAS helpers) live in
``rlx/backends/cpu/engines/``; a family's factory calls them.

Precision: f16/bf16/fp8 nodes are computed in f32 scratch buffers and rounded once into
the low-precision output (``lowp``), the same as the reference implementations do.

Aliasing: the planner may give an elementwise node its input's slot (in place). Kernels
made of several NumPy calls therefore write ``out`` only in their last call, or read the
aliased input only in the same elementwise call that writes ``out``.
"""

from __future__ import annotations

import enum
import functools
import importlib
import pkgutil
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.dtype import bf16_np, f8e4m3_np, f8e5m2_np
from rlx.ops.base import Op, RefCtx

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, Node

__all__ = [
    "KERNELS",
    "KernelKind",
    "KernelCtx",
    "KernelFactory",
    "Kernel",
    "ScratchPool",
    "ORDER",
    "kind",
    "factory_kind",
    "register",
    "kernel_kind",
    "reference_kernel",
    "lowp",
    "is_lowp",
    "load_kernels",
]

Kernel = Callable[[], None]


class KernelKind(enum.Enum):
    """How a node's kernel computes (shown in the report)."""

    NATIVE = "native"  # generated C code
    BLAS = "blas"  # NumPy calls into BLAS (matmul)
    NUMPY = "numpy"  # NumPy ufuncs writing into the arena, no allocation
    REFERENCE = "reference"  # the op's reference + a copy (allocates)
    VIEW = "view"  # no kernel: the output reinterprets its input's bytes (reshape)


class ScratchPool:
    """Scratch arrays allocated once when the schedule is built and reused by every
    kernel of that schedule: ``get(dims, dtype, tag)`` returns the same array for the same
    key. Kernels run one at a time, so two kernels may share a buffer; one kernel asks for
    distinct ``tag`` values for temporaries it needs at the same time."""

    def __init__(self) -> None:
        self._bufs: dict[tuple[tuple[int, ...], np.dtype, int], np.ndarray] = {}

    def get(self, dims: Sequence[int], dtype: Any, tag: int = 0) -> np.ndarray:
        key = (tuple(int(d) for d in dims), np.dtype(dtype), tag)
        buf = self._bufs.get(key)
        if buf is None:
            buf = np.empty(key[0], dtype=key[1])
            self._bufs[key] = buf
        return buf

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self._bufs.values())


@dataclass
class KernelCtx:
    """What a kernel factory may use besides the node and its views.

    ``params``/``inputs`` are the live name -> array mappings of the compiled graph (for
    reference implementations that read them); ``kind`` starts as the kind the factory was
    registered with and a factory may change it (a matmul on integers is not BLAS).
    ``num_threads``: threads a native kernel may use (``CompileOptions.num_threads``,
    resolved: never None). ``native``: ``CompileOptions.native``; when False a factory
    with a native (C) path takes its NumPy one instead. ``stable``: nodes whose values
    change only when a param does (params, the executor's prologue nodes); a factory may
    prepare such an input (e.g. pack a weight) in a step it appends to ``prologue``,
    which the executor runs once per param change, after the prologue nodes.
    ``batch_invariant``: ``CompileOptions.batch_invariant`` (a kernel picks one code path
    for every shape, so a row's bits do not depend on the batch around it).

    One CompiledGraph builds a schedule per shape of its symbolic dims. What does not
    depend on the shape (a weight packed into panels) should be made once for all of
    them: ``keep(key, make)`` returns the object every schedule of the compiled graph
    shares, and ``prologue_once(key, step)`` appends a step that runs once per param
    change for the whole compiled graph instead of once per schedule. ``store``: the
    executor's ParamStore (None outside an executor: each ctx keeps its own objects).
    """

    node: Node
    graph: Graph
    bindings: Mapping[str, int]
    params: Mapping[str, np.ndarray]
    inputs: Mapping[str, np.ndarray]
    pool: ScratchPool
    kind: KernelKind = KernelKind.NUMPY
    notes: list[str] = field(default_factory=list)
    num_threads: int = field(default_factory=lambda: _default_threads())
    native: bool = True
    stable: frozenset[int] = frozenset()
    prologue: list[Kernel] = field(default_factory=list)
    store: Any = None
    batch_invariant: bool = False

    def keep(self, key: Any, make: Callable[[], Any]) -> Any:
        """The object ``make()`` returns, made once per compiled graph for ``key`` and
        shared by the schedules of every shape: ``key`` must name everything the object
        depends on (e.g. ``("sgemm.pack", node.id, k, n, isa)``), none of it a view of
        the working arena (its bytes move between shapes)."""
        shared = self.store.shared if self.store is not None else self._own
        if key not in shared:
            shared[key] = make()
        return shared[key]

    def prologue_once(self, key: Any, step: Kernel) -> None:
        """Append ``step`` to ``prologue``, to run once per param change for the whole
        compiled graph (the first schedule to run after the change runs it): a step
        filling a :meth:`keep` object from params or prologue values."""
        store = self.store
        if store is None:
            self.prologue.append(step)
            return
        done = store.once_done

        def once() -> None:
            if done.get(key) != store.version:
                step()
                done[key] = store.version

        self.prologue.append(once)

    @property
    def _own(self) -> dict[Any, Any]:
        own = self.__dict__.get("_own_objects")
        if own is None:
            own = self.__dict__["_own_objects"] = {}
        return own

    def scratch(self, dims: Sequence[int], dtype: Any, tag: int = 0) -> np.ndarray:
        """A reusable scratch array (allocated now, at schedule-build time)."""
        return self.pool.get(dims, dtype, tag)

    def ref_ctx(self, out: np.ndarray) -> RefCtx:
        return RefCtx(tuple(out.shape), out.dtype, self.bindings, self.params, self.inputs)


def _default_threads() -> int:
    from rlx.backends.cpu.threads import resolve_threads

    return resolve_threads(None)


KernelFactory = Callable[["Node", list[np.ndarray], np.ndarray, KernelCtx], Kernel | None]
#: op class -> the factory the executor calls (its attempts tried in order)
KERNELS: dict[type[Op], KernelFactory] = {}
#: op class -> its attempts, in the order they are tried
ORDER: dict[type[Op], tuple[KernelFactory, ...]] = {}
#: op class -> the kernel module whose ATTEMPTS table lists it
ORIGIN: dict[type[Op], str] = {}
_KINDS: dict[type[Op], KernelKind] = {}


def kind(k: KernelKind) -> Callable[[KernelFactory], KernelFactory]:
    """Declare the report kind a factory starts with (``numpy`` when undeclared)."""

    def deco(fn: KernelFactory) -> KernelFactory:
        fn.kernel_kind = k  # type: ignore[attr-defined]
        return fn

    return deco


def factory_kind(fn: KernelFactory) -> KernelKind:
    """The kind declared by ``@kind`` on ``fn`` (``numpy`` when undeclared)."""
    return getattr(fn, "kernel_kind", KernelKind.NUMPY)  # type: ignore[no-any-return]


def _chain(attempts: tuple[KernelFactory, ...]) -> KernelFactory:
    """One factory trying ``attempts`` in order (the first kernel returned wins)."""
    if len(attempts) == 1:
        return attempts[0]

    def tried_in_order(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        for attempt in attempts:
            ctx.kind = factory_kind(attempt)
            fn = attempt(node, ins, out, ctx)
            if fn is not None:
                return fn
        return None

    tried_in_order.__name__ = " > ".join(a.__name__ for a in attempts)
    tried_in_order.attempts = attempts  # type: ignore[attr-defined]
    return tried_in_order


def register(table: Mapping[type[Op], Sequence[KernelFactory]], origin: str) -> None:
    """Enter a kernel module's ``ATTEMPTS`` table (``origin``: the module's name). An op
    listed by two modules is an error."""
    for op_cls, attempts in table.items():
        if op_cls in ORDER:
            raise TypeError(
                f"CPU kernels for {op_cls.__name__} are listed twice: by {ORIGIN[op_cls]} "
                f"and by {origin}"
            )
        if not attempts:
            raise TypeError(f"{origin} lists no kernel factory for {op_cls.__name__}")
        ORDER[op_cls] = tuple(attempts)
        ORIGIN[op_cls] = origin
        KERNELS[op_cls] = _chain(ORDER[op_cls])
        _KINDS[op_cls] = factory_kind(attempts[0])


def kernel_kind(op_cls: type[Op]) -> KernelKind:
    """The kind an op's first attempt starts with (REFERENCE without one)."""
    return _KINDS.get(op_cls, KernelKind.REFERENCE)


def reference_kernel(node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx) -> Kernel:
    """The default kernel: ``out[...] = op.reference(ins)`` (allocates the result)."""
    op = node.op
    rctx = ctx.ref_ctx(out)
    dims = tuple(out.shape)

    def run() -> None:
        r = np.asarray(op.reference(ins, rctx))
        if r.shape != dims:
            raise AssertionError(
                f"reference of %{node.id} {op} gave shape {r.shape}, its shape rule says {dims}"
            )
        np.copyto(out, r, casting="unsafe")

    return run


_loaded = False


def load_kernels() -> dict[type[Op], KernelFactory]:
    """Import every module of ``rlx.backends.cpu.kernels`` (one per op family), enter
    each one's ``ATTEMPTS`` table, and return KERNELS."""
    global _loaded
    if not _loaded:
        from rlx.backends.cpu import kernels

        for info in sorted(pkgutil.iter_modules(kernels.__path__), key=lambda m: m.name):
            module = importlib.import_module(f"{kernels.__name__}.{info.name}")
            table = getattr(module, "ATTEMPTS", None)
            if table is not None:
                register(table, module.__name__)
        _loaded = True
    return KERNELS


# ---- precision -------------------------------------------------------------------------


_F16 = np.dtype(np.float16)


@functools.cache
def _lowp_ml() -> frozenset[np.dtype]:
    return frozenset((bf16_np(), f8e4m3_np(), f8e5m2_np()))


def is_lowp(dt: np.dtype) -> bool:
    """f16, bf16 and fp8: computed in f32 by the kernels."""
    # without ml_dtypes imported no dtype can be bf16 / fp8 (an f32 model never imports it)
    return dt == _F16 or ("ml_dtypes" in sys.modules and dt in _lowp_ml())


F32 = np.dtype(np.float32)


def lowp(factory: KernelFactory) -> KernelFactory:
    """Wrap a factory so low-precision float inputs are widened into f32 scratch and a
    low-precision output is computed in f32 scratch, then rounded once into ``out``."""

    def wrapped(
        node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
    ) -> Kernel | None:
        wide_in = [is_lowp(x.dtype) for x in ins]
        wide_out = is_lowp(out.dtype)
        if not any(wide_in) and not wide_out:
            return factory(node, ins, out, ctx)
        sins = [
            ctx.scratch(x.shape, F32, 100 + i) if w else x
            for i, (x, w) in enumerate(zip(ins, wide_in, strict=True))
        ]
        sout = ctx.scratch(out.shape, F32, 99) if wide_out else out
        inner = factory(node, sins, sout, ctx)
        if inner is None:
            return None
        pairs = [(s, x) for s, x, w in zip(sins, ins, wide_in, strict=True) if w]

        def run() -> None:
            for s, x in pairs:
                np.copyto(s, x, casting="unsafe")
            inner()
            if wide_out:
                np.copyto(out, sout, casting="unsafe")

        return run

    return functools.update_wrapper(wrapped, factory)
