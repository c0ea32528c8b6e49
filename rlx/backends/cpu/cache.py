"""The in-process compile cache. In: a compile request (graph fingerprint, the options
that change the result, backend name, digest of the params given at compile). Out: the
CpuProgram compiled earlier for an equal request, or a miss.

Only the program (optimized graph, pass records, buffer plans) is shared; every
CompiledGraph built from it owns its params and arena. The cache is an LRU of
``maxsize`` programs, safe to use from several threads (one lock).
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlx.backends.cpu.program import CpuProgram

__all__ = ["CompileCache", "CacheInfo", "CacheKey", "params_digest"]

CacheKey = tuple[str, tuple[Any, ...], str, str | None]


@dataclass(frozen=True, slots=True)
class CacheInfo:
    """Counters of a compile cache."""

    hits: int
    misses: int
    size: int
    maxsize: int


def params_digest(params: Mapping[str, Any] | None) -> str | None:
    """sha256 over the names, dtypes, shapes and bytes of ``params`` (None when empty):
    passes may fold params given at compile time, so they are part of the key."""
    if not params:
        return None
    h = hashlib.sha256()
    for k in sorted(params):
        a = np.ascontiguousarray(np.asarray(params[k]))
        h.update(repr((k, str(a.dtype), a.shape)).encode())
        h.update(a.reshape(-1).view(np.uint8).data)  # the bytes in place: no copy
    return h.hexdigest()


class CompileCache:
    """An LRU of compiled programs keyed by :data:`CacheKey`."""

    def __init__(self, maxsize: int = 32):
        self.maxsize = maxsize
        self._items: OrderedDict[CacheKey, CpuProgram] = OrderedDict()
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def get(self, key: CacheKey) -> CpuProgram | None:
        with self._lock:
            return self._get(key)

    def _get(self, key: CacheKey) -> CpuProgram | None:
        prog = self._items.get(key)
        if prog is None:
            self.misses += 1
            return None
        self.hits += 1
        self._items.move_to_end(key)
        return prog

    def put(self, key: CacheKey, prog: CpuProgram) -> None:
        with self._lock:
            self._items[key] = prog
            self._items.move_to_end(key)
            while len(self._items) > self.maxsize:
                self._items.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self.hits = 0
            self.misses = 0

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self.hits, self.misses, len(self._items), self.maxsize)
