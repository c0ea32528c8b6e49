"""Data-parallel training over torch.distributed (gloo, CPU). In: a :class:`rlx.train.
TrainStep` per rank (the same model, optimizer and initial values on every rank) and each
rank's share of the global batch. Out: the same parameter updates on every rank, equal to
one process training on the global batch up to f32 reduction order.

A step: each rank runs the TrainStep's compiled loss-and-gradients graph
(``TrainStep.grads``) on its local batch; the gradients (flattened into one buffer per
dtype, each scaled by the rank's weight, by default 1) and ``[weight, weight * loss]`` are
summed over the ranks with ``all_reduce``; every rank divides by the total weight and runs
the compiled update graph (``TrainStep.apply``). With equal local batches and a mean loss
the averaged gradient is the gradient of the global batch's mean loss. Gloo's all_reduce
gives every rank the same bits, and the update graph is the same compiled code, so the
ranks' params stay identical (:meth:`DataParallel.max_param_spread` measures it).

:func:`run_data_parallel` starts ``world_size`` local processes (``spawn``), joins them
into a gloo process group through a file store and runs ``fn(rank, world_size, *args)`` in
each; on a cluster, call ``torch.distributed.init_process_group`` yourself (``env://`` or a
TCP address) and use :class:`DataParallel` directly.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlx.errors import DistributedError, InputError

__all__ = ["DataParallel", "run_data_parallel"]


class DataParallel:
    """``step`` (a :class:`rlx.train.TrainStep`) on every rank of the initialized default
    torch.distributed group (or ``group``); ``broadcast=True`` first copies rank 0's params
    and optimizer state to every rank."""

    def __init__(self, step: Any, *, group: Any = None, broadcast: bool = True):
        from rlx.train.step import TrainStep

        if not isinstance(step, TrainStep):
            raise InputError(f"DataParallel wraps an rlx.train.TrainStep, given {step!r}")
        if not dist.is_available() or not dist.is_initialized():
            raise DistributedError(
                "DataParallel: torch.distributed is not initialized; call "
                "torch.distributed.init_process_group('gloo', ...) in each rank first "
                "(or run your function with rlx.distributed.run_data_parallel)"
            )
        self.train = step
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        if broadcast:
            self.broadcast_state()

    def broadcast_state(self, src: int = 0) -> None:
        """Every rank takes rank ``src``'s params, optimizer state and step count."""
        state = self.train.state_dict()
        for k in sorted(state):
            t = torch.from_numpy(np.array(state[k], order="C"))  # 0-d stays 0-d
            dist.broadcast(t, src=src, group=self.group)
            state[k] = t.numpy()
        self.train.load_state_dict(state)

    def _all_reduce(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Sums over the ranks of ``arrays``: one collective per dtype (a flat buffer)."""
        out: list[np.ndarray] = [np.empty(0)] * len(arrays)
        by_dtype: dict[np.dtype, list[int]] = {}
        for i, a in enumerate(arrays):
            by_dtype.setdefault(a.dtype, []).append(i)
        for dtype in sorted(by_dtype, key=str):  # the same order on every rank
            idx = by_dtype[dtype]
            flat = np.concatenate([arrays[i].reshape(-1) for i in idx])
            t = torch.from_numpy(flat)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=self.group)
            sums = t.numpy()
            pos = 0
            for i in idx:
                n = arrays[i].size
                out[i] = sums[pos : pos + n].reshape(arrays[i].shape)
                pos += n
        return out

    def step(self, inputs: Mapping[str, Any], weight: float = 1.0) -> float:
        """One data-parallel step on this rank's ``inputs``; returns the mean loss over
        the ranks (weighted by ``weight``, e.g. the local batch size when the ranks'
        batches differ in size; every rank must call it)."""
        if not (isinstance(weight, (int, float)) and weight > 0):
            raise InputError(f"DataParallel.step: weight must be a number > 0, got {weight!r}")
        loss, grads = self.train.grads(inputs)
        names = list(grads)
        w = np.float64(weight)
        scaled = [np.asarray(grads[k] * grads[k].dtype.type(w)) for k in names]
        meta = np.array([w, w * loss], np.float64)
        *summed, total = self._all_reduce(scaled + [meta])
        avg = {
            k: (s / s.dtype.type(total[0])).astype(grads[k].dtype) for k, s in zip(names, summed)
        }
        self.train.apply(avg)
        return float(total[1] / total[0])

    __call__ = step

    def max_param_spread(self) -> float:
        """The largest difference of any param value between two ranks (0.0 when the ranks
        are in sync); every rank must call it."""
        params = self.train.params()
        spread = 0.0
        for k in sorted(params):
            hi = torch.from_numpy(np.ascontiguousarray(params[k], np.float64).copy())
            lo = hi.clone()
            dist.all_reduce(hi, op=dist.ReduceOp.MAX, group=self.group)
            dist.all_reduce(lo, op=dist.ReduceOp.MIN, group=self.group)
            spread = max(spread, float((hi - lo).max()) if hi.numel() else 0.0)
        return spread

    def __repr__(self) -> str:
        return f"<DataParallel rank {self.rank}/{self.world_size} of {self.train!r}>"


def _rank_main(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    init_method: str,
    args: Sequence[Any],
    results: Any,
    threads: int,
    timeout_s: float,
) -> None:
    torch.set_num_threads(threads)
    try:
        dist.init_process_group(
            "gloo",
            init_method=init_method,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        # every rank has joined before any runs fn: a rank done at once must not tear the
        # group down while a slower one is still connecting (its init would fail instead)
        dist.barrier()
        try:
            results.put((rank, True, fn(rank, world_size, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException:  # reported to the parent, which raises it
        results.put((rank, False, traceback.format_exc()))


def run_data_parallel(
    fn: Callable[..., Any],
    world_size: int,
    args: Sequence[Any] = (),
    *,
    threads_per_rank: int = 1,
    timeout_s: float = 300.0,
) -> list[Any]:
    """``fn(rank, world_size, *args)`` in ``world_size`` spawned local processes joined in
    a gloo process group; returns the ranks' return values (picklable) in rank order.
    ``fn`` must be importable (a module-level function). A rank that raises, dies or is
    not done within ``timeout_s`` is a DistributedError (the other ranks are stopped)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise InputError(f"run_data_parallel: world_size must be an int >= 1, got {world_size!r}")
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="rlx-ddp-") as tmp:
        init = f"file://{os.path.join(tmp, 'store')}"
        procs = [
            ctx.Process(
                target=_rank_main,
                args=(fn, r, world_size, init, tuple(args), results, threads_per_rank, timeout_s),
                daemon=True,
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        try:
            return _collect(procs, results, world_size, timeout_s)
        finally:
            for p in procs:  # only the processes started here, by their handles
                if p.is_alive():
                    p.terminate()
                p.join(timeout=10)


def _collect(procs: list[Any], results: Any, world_size: int, timeout_s: float) -> list[Any]:
    got: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    while len(got) < world_size:
        left = deadline - time.monotonic()
        if left <= 0:
            raise DistributedError(
                f"run_data_parallel: ranks {sorted(set(range(world_size)) - set(got))} not "
                f"done after {timeout_s:.0f} s"
            )
        try:
            rank, ok, value = results.get(timeout=min(left, 1.0))
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in got and p.exitcode not in (None, 0)]
            if dead:
                raise DistributedError(
                    f"run_data_parallel: rank {dead[0]} died (exit code {procs[dead[0]].exitcode})"
                ) from None
            continue
        if not ok:
            raise DistributedError(f"run_data_parallel: rank {rank} failed:\n{value}")
        got[rank] = value
    return [got[r] for r in range(world_size)]
