"""Generated elementwise C loops: build, load and bind (the native attempt of
ElementwiseRegion, ``kernels/fused.py``, and of the composite unaries,
``kernels/elementwise.py``; the row kernels of ``engines.rows`` load through it too). In: a
rendered ``CFunction`` and the NumPy views it runs on. Out: a closure calling ONE generated
C function that computes the whole body per output element in registers (no intermediate
in memory).

At schedule-build time (never in a run) the body is rendered to C by
:mod:`rlx.backends.cpu.codegen.elementwise`, built by :func:`rlx.backends.cpu.native.build` (cached by
sha256 of source + gcc command + gcc version; extents, strides and scalar constants are
arguments, so equal regions over layouts of one pattern, in this graph or any other, at
any symbolic-shape binding and whatever their constants, share one library) and loaded
once. Each function is named after its text (``rlx_region_<hex>``): a library that does
not export that name holds other code, and loading it is a CompileError (NumPy fallback). The closure is a
``functools.partial`` of the ctypes function with its argtypes set and its pointer
arguments precomputed. Regions whose work estimate (:func:`region_work`) reaches
:data:`PARALLEL_MIN_WORK` run on an OpenMP team of ``KernelCtx.num_threads``
(``CompileOptions.num_threads``).

Batches (issue 31, cold start). Inside :func:`batch` (or :func:`batched`), ``load_function``
does not run gcc: it returns a :class:`DeferredFunction` and ``bind`` a
:class:`DeferredKernel`; when the outermost batch ends, every deferred function is built
in ONE gcc run (one C file: the prelude once, the functions sorted by name, cached by the
content of that file, so a compile whose set of regions was built before hits the cache;
a region shared with another graph is built again inside that graph's file: the cache
key is the set, not the region) and the kernels are bound to it. The functions are the
same text as alone, so the results are the same bits. When that build fails, each
function is built alone; :func:`batched` then runs its build again without batching, so
a region gcc rejects falls back to NumPy as outside a batch.

When native kernels are off (``CompileOptions.native=False``), gcc is missing, the build
fails, or the body has something the C tables cannot render, the region's next attempt,
the NumPy region kernel of ``kernels/fused.py``, runs instead: its report kind is then
``numpy`` and its notes say why.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import numpy as np

from rlx.backends.cpu import native
from rlx.backends.cpu.codegen.elementwise import CFunction, CModule
from rlx.backends.cpu.codegen.prelude import simd_math
from rlx.backends.cpu.dispatch import Kernel
from rlx.errors import CompileError

__all__ = [
    "PARALLEL_MIN_WORK",
    "CALL_WEIGHT",
    "region_work",
    "vector_math_available",
    "load_function",
    "bind",
    "batch",
    "batched",
    "DeferredFunction",
    "DeferredKernel",
    "BatchBuildError",
]

T = TypeVar("T")

# A team pays when the region's one-thread time is well above what starting it costs.
# With libgomp's workers spinning briefly between regions (GOMP_SPINCOUNT, see
# native/__init__.py) a team of 2 costs ~0.5-1 us over one thread when the second core is
# free (16384-element add: 1.6-2.0 us on 2 threads, 1.8 us on one); with PASSIVE
# workers it cost 3 us (16K) to 11-30 us (262K), hence the old 1 << 20. Work = output
# elements * (1 + CALL_WEIGHT * math calls per element). At 1 << 18 one thread takes
# (benchmarks/threads.py --parts thresholds): add of 262144 elements 42 us, gelu (one erf) of
# 32768 elements 40 us, layer norm of 262144 (rows of 384) 66 us, softmax (one exp) of
# 32768 (rows of 128) 15 us. Lower would gain < 15 us a region and, when another job
# holds the second core, a team waits for its worker to be scheduled (measured: ~200 us
# a region at load average 5 on 2 cores), so small regions stay on one thread.
CALL_WEIGHT = 7
PARALLEL_MIN_WORK = 1 << 18


@functools.cache
def vector_math_available() -> bool:
    """Whether glibc's libmvec (SIMD exp/log/tanh/erf/sin/cos/pow) is loaded with its
    symbols global, so generated libraries calling it load. ``native.build`` links no
    extra library, so libmvec is loaded here (RTLD_GLOBAL) before any region library."""
    return bool(simd_math())


def region_work(fn: CFunction, out: np.ndarray) -> int:
    """The work estimate that decides on an OpenMP team (see PARALLEL_MIN_WORK)."""
    return math.prod(out.shape) * (1 + CALL_WEIGHT * fn.calls)


def load_function(fn: CFunction) -> Any:
    """Build (cached by content) and load ``fn``; returns the ctypes function with its
    argtypes set (inside :func:`batch`: a :class:`DeferredFunction`, built when the batch
    ends). CompileError when gcc is missing, the build fails or the library does not
    export ``fn.name`` (it holds other code: a damaged or swapped cache entry)."""
    if not native.available():
        raise CompileError("gcc is not on PATH")
    pending = getattr(_STATE, "batch", None)
    if pending is not None:
        return pending.defer(fn)
    return _load((fn,), "region")[fn.name]


def _load(fns: tuple[CFunction, ...], name: str) -> dict[str, Any]:
    """Build ``fns`` as one C file (one gcc run, cached by content) and load them: their
    ctypes functions by name, argtypes set."""
    module = CModule(fns, vector_math=vector_math_available())
    lib_path = native.build(module.source, native.Isa.PLAIN, name)
    try:
        lib = native.load(lib_path)
    except OSError as e:
        raise CompileError(f"cannot load {lib_path}: {e}") from e
    out = {}
    for fn in fns:
        try:
            cfn = getattr(lib, fn.name)
        except AttributeError as e:
            raise CompileError(
                f"{lib_path} does not export {fn.name}: the cached library holds other code"
            ) from e
        cfn.argtypes = [ctypes.c_void_p] * fn.num_pointers + [ctypes.c_long]
        cfn.restype = None
        out[fn.name] = cfn
    return out


def bind(cfn: Any, arrays: list[np.ndarray], nthreads: int = 1) -> Kernel:
    """A zero-argument call of ``cfn`` on ``arrays`` with ``nthreads`` (all bound now; a
    :class:`DeferredFunction` gives a :class:`DeferredKernel`)."""
    ptrs = [ctypes.c_void_p(a.ctypes.data) for a in arrays]
    if isinstance(cfn, DeferredFunction):
        if cfn.cfn is None:
            pending = getattr(_STATE, "batch", None)
            if pending is None:  # cached by a caller beyond a batch that failed: build now
                cfn.cfn = _load((cfn.fn,), "region")[cfn.fn.name]
            else:
                cfn.owner = pending  # (one of an earlier batch: this one builds it now)
                cfn = pending.deferred.setdefault(cfn.fn.name, cfn)
                return DeferredKernel(cfn, (*ptrs, ctypes.c_long(nthreads)), arrays)
        cfn = cfn.cfn
    run: Any = functools.partial(cfn, *ptrs, ctypes.c_long(nthreads))
    run.keepalive = arrays  # constants rendered as arrays live as long as the kernel
    return run  # type: ignore[no-any-return]


class DeferredFunction:
    """A region function of a :func:`batch`, loaded when the batch ends (``cfn``)."""

    __slots__ = ("fn", "cfn", "owner")

    def __init__(self, fn: CFunction, owner: _Batch):
        self.fn = fn
        self.cfn: Any = None
        self.owner = owner

    def resolve(self) -> Any:
        """The loaded function; a use before the batch ends (a kernel factory that runs
        or schedules another kernel while building) builds what is deferred so far."""
        if self.cfn is None:
            self.owner.build()
        return self.cfn

    def __call__(self, *args: Any) -> None:
        self.resolve()(*args)


class DeferredKernel:
    """:func:`bind` of a :class:`DeferredFunction`: callable once its batch is built, and
    one native call for the native schedule (``native_call``)."""

    __slots__ = ("fn", "args", "keepalive")

    def __init__(self, fn: DeferredFunction, args: tuple[Any, ...], keepalive: list[np.ndarray]):
        self.fn = fn
        self.args = args
        self.keepalive = keepalive

    def __call__(self) -> None:
        self.fn.resolve()(*self.args)

    @property
    def native_call(self) -> tuple[Any, tuple[Any, ...], bool]:
        """``(ctypes function, arguments, checked)`` (see ``native/schedule.py``)."""
        return self.fn.resolve(), self.args, False


class _Batch:
    def __init__(self) -> None:
        self.deferred: dict[str, DeferredFunction] = {}

    def defer(self, fn: CFunction) -> DeferredFunction:
        d = self.deferred.get(fn.name)
        if d is None:
            d = self.deferred[fn.name] = DeferredFunction(fn, self)
        return d

    def build(self) -> None:
        """One gcc run for all not yet built (sorted by name); on a failure, each alone
        (the first that fails alone raises its CompileError)."""
        todo = {name: d for name, d in self.deferred.items() if d.cfn is None}
        if not todo:
            return
        fns = tuple(d.fn for _, d in sorted(todo.items()))
        try:
            got = _load(fns, "regions") if len(fns) > 1 else _load(fns, "region")
        except CompileError:
            got = {}
            try:
                for fn in fns:
                    got |= _load((fn,), "region")
            except CompileError as e:
                raise BatchBuildError(e.bare_message) from e
        for name, d in todo.items():
            d.cfn = got[name]


class BatchBuildError(CompileError):
    """A region of a :func:`batch` does not build (alone either)."""


_STATE = threading.local()


@contextlib.contextmanager
def batch() -> Iterator[None]:
    """Defer the region builds of this thread to the end of the outermost ``batch``,
    then build them in one gcc run (see the module docstring). BatchBuildError at the
    end when a region does not build alone either (its kernels are not usable then)."""
    if getattr(_STATE, "batch", None) is not None:
        yield  # nested: the outer batch builds
        return
    b = _STATE.batch = _Batch()
    try:
        yield
    finally:
        _STATE.batch = None
    b.build()


def in_batch() -> bool:
    """Whether this thread is inside a :func:`batch` (a nested build joins it)."""
    return getattr(_STATE, "batch", None) is not None


def batched(build: Callable[[], T], reset: Callable[[], object] | None = None) -> T:
    """``build()`` with its region builds batched into one gcc run; when that fails,
    ``reset()`` (if given) and ``build()`` again without batching (each region alone, a
    region gcc rejects falls back as its caller says)."""
    try:
        with batch():
            return build()
    except BatchBuildError:
        if reset is not None:
            reset()
        return build()
