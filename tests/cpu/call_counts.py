"""Kernel call counters for executor tests (counting calls, never timing). In: an
Executor. Out: a list that its prologue kernels and prepare steps, wrapped in place,
increment on each call (:func:`count_calls`)."""

from __future__ import annotations

from collections.abc import Callable

from rlx.backends.cpu.executor import Executor


def count_calls(ex: Executor) -> list[int]:
    """Wrap every prologue kernel and prepare step of ``ex`` with a call counter: entry i
    of the returned list counts prologue[i], then entry len(prologue) + j prepare[j]."""
    counts = [0] * (len(ex.prologue) + len(ex.prepare))

    def wrap(f: Callable[[], None], i: int) -> Callable[[], None]:
        def g() -> None:
            counts[i] += 1
            f()

        return g

    ex.prologue[:] = [wrap(f, i) for i, f in enumerate(ex.prologue)]
    k = len(ex.prologue)
    ex.prepare[:] = [wrap(f, k + i) for i, f in enumerate(ex.prepare)]
    return counts
