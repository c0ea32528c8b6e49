"""Where an executor's views live. In: a graph's param, constant and param-derived
(prologue) nodes, and the working bytes and kernel scratch of each plan. Out: two
objects one CompiledGraph shares between the schedules of all its shapes:

* :class:`ParamStore`: the params (the user's array itself when it is safe to read in
  place, else one private copy), the constants, and one buffer per param-derived node
  the prologue computes. Their values do not depend on the symbol bindings, so every
  schedule reads the same bytes: a new shape copies no weight. Kernels get read-only
  views of params and constants (NumPy refuses a write; native code must not write them;
  the one exception is state: ``cache_attention`` writes its KV cache params' private
  storage, :meth:`ParamStore.private`, and ``assign`` a param's, :meth:`ParamStore.write`).
* :class:`Workspace`: one 64-byte-aligned buffer holding the working region of the plan
  that runs (activations) and, above it, the kernels' scratch. Runs of one
  CompiledGraph never overlap (it holds a lock), so every plan uses the same bytes;
  the buffer grows to the largest plan in use.

Both carry a ``generation`` that changes when bytes an executor holds views into move
(a workspace that grows, a param whose array is replaced): an executor built at an
older generation is stale and is rebuilt (:meth:`Executor.is_current`). ``version``
counts param value changes: an executor whose prologue ran at an older version runs it
again (its param-derived values and the kernels' packed weights are out of date).

Before an executor allocates, :func:`check_memory` compares what its schedule needs with
this machine's memory (``/proc/meminfo``): more than the RAM is a CompileError naming the
largest buffers and their shapes (a static shape of 2**40 elements used to reach NumPy's
bare MemoryError, or worse, a zeroed arena NumPy hands out lazily); more than half the
RAM, or more than is available now, is allocated with a RuntimeWarning saying so.
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np

from rlx.backends.cpu.dispatch import ScratchPool
from rlx.errors import CompileError
from rlx.ir.lir import format_bytes
from rlx.ir.mir import Graph, NodeId
from rlx.ops.core import Param

__all__ = [
    "ARENA_ALIGNMENT",
    "ParamStore",
    "Workspace",
    "ArenaScratch",
    "aligned_arena",
    "safe_to_share",
    "check_memory",
    "machine_memory",
]

ARENA_ALIGNMENT = 64
_GROWTH = 1.25  # a workspace that must grow takes at least this factor (fewer rebuilds)
_PAGE = 4096
#: Below this many bytes a schedule is not compared with the machine's memory (every
#: machine rlx runs on has it; reading /proc/meminfo costs a new shape ~20 us).
CHECK_MEMORY_FROM = 64 << 20


def machine_memory() -> tuple[int | None, int | None]:
    """``(total, available)``: this machine's RAM and the memory available now, in bytes
    (``MemTotal`` and ``MemAvailable`` of ``/proc/meminfo``; ``os.sysconf`` where that
    file is missing); None for a figure that cannot be read."""
    found: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    found[key] = int(rest.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        pass
    for key, pages in (("MemTotal", "SC_PHYS_PAGES"), ("MemAvailable", "SC_AVPHYS_PAGES")):
        if key not in found:
            try:
                found[key] = os.sysconf(pages) * os.sysconf("SC_PAGE_SIZE")
            except (AttributeError, OSError, ValueError):
                pass
    return found.get("MemTotal"), found.get("MemAvailable")


def _size(n: int) -> str:
    return f"{format_bytes(n)} ({n} bytes)"


def check_memory(nbytes: int, describe: Callable[[], str]) -> None:
    """Whether ``nbytes`` (what a schedule is about to allocate) fit this machine:
    CompileError above its RAM; a RuntimeWarning above half of it or above the memory
    available now (NumPy hands out a zeroed buffer lazily, so nothing else would say so
    before a run swaps or the process is killed). ``describe()`` names what needs the
    bytes (graph, bindings, largest buffers) for the messages."""
    if nbytes < CHECK_MEMORY_FROM:
        return
    total, available = machine_memory()
    if total is not None and nbytes > total:
        raise CompileError(
            f"{describe()}; that is more than this machine's RAM ({_size(total)}, MemTotal), "
            "so it is not allocated"
        )
    over = []
    if total is not None and nbytes > total // 2:
        over.append(f"more than half of this machine's RAM ({format_bytes(total)})")
    if available is not None and nbytes > available:
        over.append(f"more than is available now ({format_bytes(available)}, MemAvailable)")
    if over:
        warnings.warn(
            f"rlx: {describe()}; that is {' and '.join(over)}: it is allocated, but runs "
            "may swap or the process may be killed for want of memory",
            RuntimeWarning,
            stacklevel=2,
        )


def aligned_arena(nbytes: int, alignment: int = ARENA_ALIGNMENT) -> np.ndarray:
    """A zeroed uint8 array of ``nbytes`` whose first byte is ``alignment``-aligned."""
    raw = np.zeros(nbytes + alignment, dtype=np.uint8)
    skip = (-raw.ctypes.data) % alignment
    return raw[skip : skip + nbytes]


def _align(n: int, a: int = ARENA_ALIGNMENT) -> int:
    return -(-n // a) * a


def safe_to_share(arr: np.ndarray) -> bool:
    """Whether ``arr`` may be read in place for as long as a CompiledGraph lives: C-ordered,
    aligned for its dtype, read-only, and not a view of memory that is writable through
    another array (a read-only view of the caller's writable array could still change).
    A read-only file mapping (``np.memmap(mode="r")``, safetensors) and bytes qualify."""
    if arr.flags.writeable or not arr.flags.c_contiguous or not arr.flags.aligned:
        return False
    base: Any = arr.base
    while base is not None:
        if isinstance(base, np.ndarray):
            if base.flags.writeable:
                return False
            base = base.base
        elif isinstance(base, (bytes, memoryview)):
            return isinstance(base, bytes) or base.readonly
        else:  # an mmap.mmap or another buffer owner: read-only when numpy says so
            try:
                return memoryview(base).readonly
            except TypeError:
                return False
    return True  # owns its data and is read-only: taken as a promise not to change it


def _bytes_of(arr: np.ndarray) -> np.ndarray:
    """The bytes of a C-contiguous array as a flat uint8 array (same memory)."""
    return arr.reshape(-1).view(np.uint8)


class ParamStore:
    """Params, constants and prologue values of one compiled graph (module docstring).

    ``params``: name -> read-only array, the live mapping kernels get as
    ``KernelCtx.params``. ``shared``: objects kernels keep across schedules
    (``KernelCtx.keep``). ``version`` / ``generation``: see the module docstring."""

    def __init__(self, graph: Graph, params: MutableMapping[str, np.ndarray] | None = None):
        self.graph = graph
        self.params: MutableMapping[str, np.ndarray] = {} if params is None else params
        # name -> (writable private storage, the read-only view in params)
        self._owned: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._param_nodes = {
            n.op.name: n  # type: ignore[attr-defined]
            for n in graph.nodes
            if isinstance(n.op, Param)
        }
        self._constants: dict[NodeId, np.ndarray] = {}
        self._hoisted: dict[tuple[NodeId, int], np.ndarray] = {}
        self.shared: dict[Hashable, Any] = {}
        # node id -> its view, for persistent nodes of static shape (cleared when a
        # param's storage moves)
        self.views: dict[NodeId, np.ndarray] = {}
        self.once_done: dict[Hashable, int] = {}
        self.version = 0  # param values changed this many times
        self.generation = 0  # param storage moved this many times
        self.hoisted_version = -1  # the version the shared prologue values were computed at
        self._derived: frozenset[NodeId] | None = None

    @property
    def derived(self) -> frozenset[NodeId]:
        """The graph's param-derived nodes (:func:`~rlx.backends.cpu.planner.param_derived_nodes`)."""
        if self._derived is None:
            from rlx.backends.cpu.planner import param_derived_nodes

            self._derived = param_derived_nodes(self.graph)
        return self._derived

    # ---- params -------------------------------------------------------------------------

    def set(self, name: str, arr: np.ndarray, *, share: bool = True, fresh: bool = False) -> None:
        """Store ``arr`` (already checked: the node's dtype and dims) as param ``name``.
        With ``share``, a :func:`safe_to_share` array, or a ``fresh`` one nobody else
        holds, is kept as is; any other is copied into private storage (in place when
        that has the same shape, so executors stay valid)."""
        if share and fresh and arr.base is None and arr.flags.c_contiguous and arr.flags.aligned:
            arr.flags.writeable = False
        if share and not arr.flags.writeable and safe_to_share(arr):
            self._replace(name, arr)
            self._owned.pop(name, None)
        else:
            own, ro = self._owned.get(name, (None, None))
            if own is None or own.shape != arr.shape or own.dtype != arr.dtype:
                own = _bytes_to(aligned_arena(arr.nbytes), arr.dtype, arr.shape)
                ro = _readonly(own)
                self._owned[name] = (own, ro)
            self._replace(name, ro)
            np.copyto(own, arr, casting="unsafe")
        self.version += 1

    def _replace(self, name: str, arr: np.ndarray) -> None:
        if self.params.get(name) is not arr:
            self.params[name] = arr
            self.generation += 1
            self.views.clear()

    def private(self, name: str) -> np.ndarray | None:
        """The writable private storage behind param ``name`` (a param never set gets
        zeroed storage, see :meth:`param_bytes`; a given one that was copied), or None when
        kernels read the caller's array in place. Only a stateful op's kernel writes it
        (``cache_attention``: the KV cache, ``rlx/ops/kvcache.py``)."""
        own = self._owned.get(name)
        return own[0] if own is not None and self.params.get(name) is own[1] else None

    def write(self, name: str, value: np.ndarray) -> None:
        """Copy ``value`` (the param's dtype and dims) into param ``name``'s private
        storage in place and count a value change (``version``): what the ``assign`` op's
        kernel does. A param read from the caller's array in place first gets private
        storage (the caller's array is never written; ``generation`` moves once)."""
        own = self.private(name)
        if own is None or own.shape != value.shape:
            self.set(name, value, share=False)
            return
        np.copyto(own, value, casting="unsafe")
        self.version += 1

    def param_bytes(self, name: str, dims: Sequence[int]) -> np.ndarray:
        """The bytes of param ``name``; a param not set yet gets zeroed private storage of
        ``dims`` (its node's dims under the executor's bindings)."""
        arr = self.params.get(name)
        want = math.prod(dims) * self._param_nodes[name].dtype.np.itemsize
        if arr is None or arr.nbytes < want:
            dt = self._param_nodes[name].dtype.np
            own = _bytes_to(aligned_arena(want), dt, tuple(dims))
            self._owned[name] = (own, _readonly(own))
            self._replace(name, self._owned[name][1])
            arr = self.params[name]
        return _bytes_of(arr)

    # ---- constants and prologue values --------------------------------------------------

    def constant_bytes(self, nid: NodeId) -> np.ndarray:
        """The bytes of constant node ``nid`` (read-only; made once)."""
        arr = self._constants.get(nid)
        if arr is None:
            node = self.graph.nodes[nid]
            value = node.op.value.array()  # type: ignore[attr-defined]
            dt = node.dtype.np
            if value.dtype == dt and value.flags.c_contiguous and value.flags.aligned:
                arr = value if not value.flags.writeable else _readonly(value.copy())
            else:
                own = _bytes_to(aligned_arena(value.size * dt.itemsize), dt, value.shape)
                np.copyto(own, value, casting="unsafe")
                arr = _readonly(own)
            self._constants[nid] = arr
        return _bytes_of(arr)

    def hoisted_bytes(self, nid: NodeId, nbytes: int) -> np.ndarray:
        """Writable storage for param-derived node ``nid`` (computed by the prologue)."""
        key = (nid, nbytes)
        buf = self._hoisted.get(key)
        if buf is None:
            buf = self._hoisted[key] = aligned_arena(nbytes)
        return buf

    @property
    def nbytes(self) -> int:
        """Bytes held privately (copies of params, constants, prologue values)."""
        own = sum(a.nbytes for a, _ in self._owned.values())
        return own + sum(b.nbytes for b in self._hoisted.values())


def _bytes_to(buf: np.ndarray, dtype: Any, shape: Sequence[int]) -> np.ndarray:
    n = math.prod(shape) * np.dtype(dtype).itemsize
    return buf[:n].view(dtype).reshape(tuple(shape))


def _readonly(arr: np.ndarray) -> np.ndarray:
    v = arr.view()
    v.flags.writeable = False
    return v


class Workspace:
    """The working arena plus kernel scratch shared by the plans of one CompiledGraph
    (module docstring). ``shared``: False for an executor's private workspace (its
    scratch may then live outside the buffer without a rebuild)."""

    def __init__(self, shared: bool = True):
        self.shared = shared
        self.buffer = aligned_arena(0)
        self.generation = 0
        self.scratch_hint = 0  # the most scratch bytes one schedule asked for so far

    def ensure(self, nbytes: int) -> None:
        """Make the buffer at least ``nbytes`` long (a new, bigger buffer: views into the
        old one are stale, ``generation`` changes)."""
        have = self.buffer.nbytes
        if nbytes <= have:
            return
        size = max(nbytes, int(have * _GROWTH)) if self.shared else nbytes
        self.buffer = aligned_arena(_align(size, _PAGE))
        self.generation += 1

    @property
    def nbytes(self) -> int:
        return int(self.buffer.nbytes)


class ArenaScratch(ScratchPool):
    """A ScratchPool that carves its arrays from a workspace buffer from byte ``start``
    on; what does not fit is allocated on its own (``spilled`` bytes) and ``needed``
    says how far the buffer would have to reach."""

    def __init__(self, buffer: np.ndarray, start: int):
        super().__init__()
        self._buffer = buffer
        self._top = _align(start)
        self.start = self._top
        self.spilled = 0

    def get(self, dims: Sequence[int], dtype: Any, tag: int = 0) -> np.ndarray:
        key = (tuple(int(d) for d in dims), np.dtype(dtype), tag)
        buf = self._bufs.get(key)
        if buf is None:
            nbytes = math.prod(key[0]) * key[1].itemsize
            off = self._top
            if off + nbytes <= self._buffer.nbytes:
                buf = self._buffer[off : off + nbytes].view(key[1]).reshape(key[0])
            else:
                buf = np.empty(key[0], dtype=key[1])
                self.spilled += nbytes
            self._top = _align(off + nbytes)
            self._bufs[key] = buf
        return buf

    @property
    def needed(self) -> int:
        """Bytes of the buffer this pool's arrays would take (working region included)."""
        return self._top

    @property
    def scratch_bytes(self) -> int:
        return self._top - self.start


def check_param_dims(
    store: ParamStore, bindings: Mapping[str, int]
) -> list[tuple[str, tuple[int, ...], tuple[int, ...]]]:
    """Params whose stored shape is not their node's shape under ``bindings``:
    (name, expected, given)."""
    bad = []
    for name, node in store._param_nodes.items():
        arr = store.params.get(name)
        if arr is None:
            continue
        want = node.shape.concrete(bindings)
        if tuple(arr.shape) != want:
            bad.append((name, want, tuple(arr.shape)))
    return bad
