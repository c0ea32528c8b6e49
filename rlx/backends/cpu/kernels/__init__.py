"""CPU kernel table. In: a node plus NumPy views of its input and output arena slots.
Out: a zero-argument closure that computes the node into its output view.

``KERNELS`` maps an op class to a *factory* ``(node, ins, out, ctx) -> Callable[[], None]``
registered with ``@kernel(OpClass, kind)``. A factory may return ``None`` to decline a node
it has no fast path for (an integer division, a complex input...): the node then gets the
default kernel. A factory may raise :class:`~rlx.errors.UnsupportedOpError`; the executor
collects every such node and fails the compile with one list.

The default kernel (``reference_kernel``) calls the op's NumPy ``reference`` and copies the
result into the output view: it allocates a fresh array per call and is listed as
``reference`` in the report. Every op therefore runs; a kernel here only makes it faster.

Precision: f16/bf16/fp8 nodes are computed in f32 scratch buffers and rounded once into
the low-precision output (``lowp``), the same as the reference implementations do.

Aliasing: the planner may give an elementwise node its input's slot (in place). Kernels
made of several NumPy calls therefore write ``out`` only in their last call, or read the
aliased input only in the same elementwise call that writes ``out``.

The kernels themselves live in one module per op family in this package
(``kernels.elementwise``: unary, binary, compare, where; ``kernels.lowp_lib``: cast and the
native bf16/f16 paths; ``kernels.tensor``: reductions, norms, movement; ``kernels.linalg``:
matmul, dot_general; ``kernels.nn``: attention, rope; ``kernels.nn_grad``: the backward
ops of the norms, attention (``csrc/norm_grad.c``, ``csrc/attention_grad.c``) and rope;
``kernels.nn_grad_conv``: conv and pool backward; ``kernels.conv``: conv, pool;
``kernels.fused``: fused ops and elementwise regions; ``kernels.region``: native
generated elementwise regions; ``kernels.rows``: native row kernels and matmul
epilogues; ``kernels.quant``: quantize / dequantize; ``kernels.qgemm``: the integer
GEMMs (qmatmul, dynamic_qmatmul, dynamic_qbatch_matmul, qconv2d on the int8 GEMM);
``kernels.dequant``: the
weight-only DequantMatMul on packed bytes; ``kernels.misc``: group_norm,
scatter_add, fake_quantize, exclusive cumsum, integer division and power;
``kernels.fft``: fft; ``kernels.select``: topk; ``kernels.recurrent``: gated_delta_net;
``kernels.intmath``: integer matmul and dot_general; ``kernels.control``: If / While /
Scan as compiled sub-programs; ``kernels.corners``: complex, bool and non-f32 quantize
corners; ``kernels.seed``: selective_scan, the dense solves, grouped / LoRA matmuls,
qconv2d without the native library, sample, custom_fn; ``kernels.indexing``:
gather_elements, scatter_elements, gather_nd, scatter_nd; ``kernels.bitmath``: bitwise,
bitwise_not, trig, cumprod, bitcast; ``kernels.reduce_grad``: softmax_backward,
log_softmax_backward; ``kernels.grad_util``: gather_backward); ``load_kernels`` imports every module of
the package. Every built-in op has a factory here (``tests/cpu/test_kernel_coverage.py``):
the reference kernel is for custom ops.
"""

from __future__ import annotations

import enum
import importlib
import pkgutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

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
    "kernel",
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
KERNELS: dict[type[Op], KernelFactory] = {}
_KINDS: dict[type[Op], KernelKind] = {}


def kernel(
    op_cls: type[Op],
    kind: KernelKind = KernelKind.NUMPY,
    *,
    supersedes: KernelFactory | None = None,
) -> Callable[[KernelFactory], KernelFactory]:
    """Register a kernel factory for ``op_cls`` (one per op class). A faster factory may
    take the place of the registered one by naming it in ``supersedes`` (it then usually
    falls back to it); replacing any other factory is an error."""

    def deco(fn: KernelFactory) -> KernelFactory:
        if op_cls in KERNELS and (supersedes is None or KERNELS[op_cls] is not supersedes):
            raise TypeError(f"a CPU kernel for {op_cls.__name__} is registered twice")
        KERNELS[op_cls] = fn
        _KINDS[op_cls] = kind
        return fn

    return deco


def kernel_kind(op_cls: type[Op]) -> KernelKind:
    """The kind an op's registered factory starts with (REFERENCE without one)."""
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
    """Import every module of this package (each registers its factories on import) and
    return KERNELS."""
    global _loaded
    if not _loaded:
        for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
            importlib.import_module(f"{__name__}.{info.name}")
        _loaded = True
    return KERNELS


# ---- precision -------------------------------------------------------------------------


_LOWP = frozenset(
    np.dtype(t)
    for t in (np.float16, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn, ml_dtypes.float8_e5m2)
)


def is_lowp(dt: np.dtype) -> bool:
    """f16, bf16 and fp8: computed in f32 by the kernels."""
    return dt in _LOWP


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

    wrapped.__name__ = getattr(factory, "__name__", "lowp")
    wrapped.__doc__ = factory.__doc__
    return wrapped
