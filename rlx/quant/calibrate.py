"""Activation-range calibration for post-training INT8 quantization.

In: a CompiledGraph whose outputs include the *taps* (the tensors to calibrate), and
batches of inputs. Out: per tap, a clipping threshold ``amax`` and the symmetric INT8
scale ``max(amax / 127, SCALE_FLOOR)`` (the floor, 1e-6, avoids a zero scale on a flat
tensor); also the signed min / max of each tap (asymmetric u8 ranges) and, on request, the
max ``|x|`` of each channel of the last axis (SmoothQuant's per-channel statistics).

The floor coarsens the grid of a tap whose step ``amax / 127`` is below it (and below
``SCALE_FLOOR / 2`` every value quantizes to 0): ``rlx.quantize`` does not use such a
scale. :mod:`rlx.quant.static` applies the same floor to the s8 and the u8 step and keeps
the layers of a tap whose step the floor would change in float, saying so.

Three calibrators share one interface (``step(inputs)``, ``amax()``, ``scales()``, and
the seed's arena access: ``arena()`` / ``arena_mut()`` give the compiled graph's arena,
``graph()`` the graph the taps belong to, and ``step()`` without inputs runs on what was
written into the arena, as the seed's harness does):

* :class:`Calibrator`: the running max-abs (the seed's behaviour: worst-case-correct for
  roughly zero-centred activations, but one outlier stretches the range);
* :class:`PercentileCalibrator`: the ``percentile`` of ``|x|`` over every value seen (the
  value of rank ``ceil(percentile / 100 * n)``, np.percentile's ``inverted_cdf``, with the
  rank computed exactly: see :meth:`StreamingHistogram.percentile`);
* :class:`EntropyCalibrator`: the threshold minimising the KL divergence between the
  distribution of ``|x|`` and its 128-level quantization (TensorRT's entropy
  calibration, Migacz 2017, "8-bit Inference with TensorRT", as NVIDIA's
  pytorch-quantization implements it; see :func:`kl_threshold`). The histogram is over
  ``|x|`` because the int8 scheme is symmetric: 128 levels cover ``[0, amax]``. Bin 0
  (the exact zeros of a ReLU output) does not steer the search: left as is, a ReLU's
  50% zero spike picked 1.50 where the max-abs was 4.12 and made the quantized MLP of
  ``tests/quant/test_api.py`` 13x less accurate than max-abs.

The last two keep a streaming histogram of ``|x|`` per tap with a fixed number of bins over
``[0, hi)``, ``hi`` the smallest power of two above every value seen: when a larger value
arrives ``hi`` doubles and adjacent bins merge in pairs. Memory is therefore fixed
whatever the number of batches, and the histogram equals the one-shot histogram of all
the data (with power-of-two ``hi`` and bin counts, bin indices are exact).

``calibrate(compiled, batches, method=...)`` runs a calibrator over an iterable of input
dicts, with a tqdm progress bar when tqdm is installed (``pip install rlx[progress]``).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from rlx.errors import QuantizationError
from rlx.ir.mir import Graph, NodeId
from rlx.runtime.compiled import CompiledGraph

__all__ = [
    "Calibrator",
    "CalibrationArena",
    "PercentileCalibrator",
    "EntropyCalibrator",
    "StreamingHistogram",
    "CalibrationMethod",
    "calibrate",
    "kl_threshold",
]

#: The smallest symmetric INT8 scale :meth:`Calibrator.scales` gives (and the smallest
#: activation step ``rlx.quantize`` uses, s8 or u8: see :mod:`rlx.quant.static`).
SCALE_FLOOR = 1e-6
_F32_MAX = float(np.finfo(np.float32).max)


class CalibrationMethod(enum.Enum):
    """How :func:`calibrate` picks each tap's clipping threshold."""

    MAX_ABS = "max_abs"
    PERCENTILE = "percentile"
    ENTROPY = "entropy"


class Calibrator:
    """Running max-abs per tap, and the signed min / max of its finite values (for
    asymmetric u8 ranges). ``taps`` are node ids of the compiled graph's source graph and
    must be among its outputs (their values are what ``run`` returns). With
    ``channel_stats`` the max ``|x|`` of every index of the last axis is kept too
    (:meth:`channel_max_abs`, what SmoothQuant's per-channel scales are made of)."""

    def __init__(
        self, compiled: CompiledGraph, taps: Sequence[NodeId], *, channel_stats: bool = False
    ):
        outputs = list(compiled.program.source.outputs)
        bad = [t for t in taps if t not in outputs]
        if bad:
            raise QuantizationError(
                f"calibration taps {bad} are not outputs of graph {compiled.program.source.name!r} "
                f"(outputs: {outputs}); add them with graph.set_outputs(...) before compiling"
            )
        if not taps:
            raise QuantizationError("a calibrator needs at least one tap")
        self.compiled = compiled
        self.taps: tuple[NodeId, ...] = tuple(int(t) for t in taps)
        self._positions = [outputs.index(t) for t in self.taps]
        self._max_abs = np.zeros(len(self.taps), np.float32)
        self._finite = np.zeros(len(self.taps), np.int64)
        self._nonfinite = np.zeros(len(self.taps), np.int64)
        self._min = np.full(len(self.taps), np.inf, np.float64)
        self._max = np.full(len(self.taps), -np.inf, np.float64)
        self.channel_stats = channel_stats
        self._channel: list[np.ndarray | None] = [None] * len(self.taps)
        self.batches = 0

    def step(self, inputs: Mapping[str, Any] | None = None) -> None:
        """Run one batch and fold every tap's values into the statistics. ``inputs``: a
        dict of input name -> array; None runs on the values already in the arena (written
        through :meth:`arena_mut`, the seed's way)."""
        outs = self.compiled.run(inputs) if inputs is not None else self._run_arena()
        for i, pos in enumerate(self._positions):
            x = np.asarray(outs[pos], dtype=np.float32)
            ok = np.isfinite(x)
            signed = x[ok]
            finite = np.abs(signed)
            self._finite[i] += finite.size
            self._nonfinite[i] += x.size - finite.size
            if finite.size:
                self._max_abs[i] = max(self._max_abs[i], float(finite.max()))
                self._min[i] = min(self._min[i], float(signed.min()))
                self._max[i] = max(self._max[i], float(signed.max()))
            if self.channel_stats and x.ndim >= 1 and x.size:
                a = np.where(ok, np.abs(x), np.float32(0)).reshape(-1, x.shape[-1]).max(axis=0)
                prev = self._channel[i]
                self._channel[i] = a if prev is None else np.maximum(prev, a)
            self._observe(i, finite)
        self.batches += 1

    def _observe(self, i: int, abs_values: np.ndarray) -> None:
        """Subclasses fold ``|x|`` (finite values, flattened) of tap ``i`` in."""

    def graph(self) -> Graph:
        """The graph the taps are node ids of (the compiled graph's source graph), to look
        node ids up again after compilation."""
        return self.compiled.program.source

    def arena(self) -> CalibrationArena:
        """Read-only access to the arena (the values of the most recent step): for reading
        tap values when something other than the running statistics is wanted."""
        return CalibrationArena(self.compiled, writable=False)

    def arena_mut(self) -> CalibrationArena:
        """Writable access to the arena: write inputs (``write(name_or_id, array)``, or
        bytes at ``byte_offset``) before a :meth:`step` without inputs."""
        return CalibrationArena(self.compiled, writable=True)

    def _run_arena(self) -> list[np.ndarray]:
        """Run the schedule on the arena as it is; copies of the outputs (source order)."""
        from rlx.backends.cpu import threads

        cg = self.compiled
        with cg._lock:
            ex = cg._executor_any()
            threads.ensure_blas_threads(threads.blas_threads_for(cg.num_threads, ex))
            with np.errstate(all="ignore"):
                if ex.stale:
                    ex.run_prologue()
                for f in ex.schedule:
                    f()
            return [v.copy() for v in ex.output_views]

    def value_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per tap (in tap order): how many finite and how many non-finite (NaN, +-inf)
        values were seen so far. Only finite values enter the statistics, so a tap that
        saw no finite value, or only zeros, has no usable range (``amax`` 0)."""
        return self._finite.copy(), self._nonfinite.copy()

    def max_abs(self) -> np.ndarray:
        """Per-tap max ``|x|`` seen so far (f32, in tap order)."""
        return self._max_abs.copy()

    def min_max(self) -> tuple[np.ndarray, np.ndarray]:
        """Per tap, the smallest and largest finite value seen (f64; +inf / -inf for a tap
        that saw no finite value)."""
        return self._min.copy(), self._max.copy()

    def channel_max_abs(self) -> list[np.ndarray | None]:
        """Per tap, max ``|x|`` of each index of the last axis (f32 ``[C]``; non-finite
        values count as 0). None for a tap without values, or without ``channel_stats``."""
        return [None if c is None else c.copy() for c in self._channel]

    def amax(self) -> np.ndarray:
        """Per-tap clipping threshold (here: the max-abs)."""
        return self.max_abs()

    def scales(self) -> np.ndarray:
        """Per-tap INT8 scale ``max(amax / 127, 1e-6)``."""
        return np.maximum(self.amax() / np.float32(127.0), np.float32(SCALE_FLOOR)).astype(
            np.float32
        )

    def scale_map(self) -> dict[NodeId, float]:
        """Tap node id -> scale."""
        return {t: float(s) for t, s in zip(self.taps, self.scales(), strict=True)}


class CalibrationArena:
    """The arena of a calibrator's compiled graph (the seed's ``Arena``), for the arena of
    its most recent run (or its first plan). Nodes are named by the calibrator's graph:
    a tap or other output's node id, an input's node id, or an input's name.

    ``buffer``: the arena bytes (uint8; read-only unless from ``arena_mut()``);
    ``byte_offset(node)``: where a node's value starts in it; ``view(node)``: the value
    as a typed array; ``write(node, values)``: copy values in (writable arenas only)."""

    def __init__(self, compiled: CompiledGraph, *, writable: bool):
        with compiled._lock:
            self._ex = compiled._executor_any()
        self._compiled = compiled
        self.writable = writable
        buf = self._ex.arena.view()
        buf.flags.writeable = writable
        self.buffer: np.ndarray = buf

    def _node(self, node: NodeId | str) -> NodeId:
        """The compiled graph's node id for a source node id or an input name."""
        src = self._compiled.program.source
        graph = self._ex.graph
        inputs = {n.op.name: n.id for n in graph.input_nodes()}  # type: ignore[attr-defined]
        if isinstance(node, str):
            if node not in inputs:
                raise QuantizationError(
                    f"the arena of graph {src.name!r} has no input named {node!r}; "
                    f"inputs: {sorted(inputs)}"
                )
            return inputs[node]
        nid = int(node)
        if nid in src.outputs:
            return graph.outputs[src.outputs.index(nid)]
        if 0 <= nid < len(src.nodes) and src.nodes[nid].op.mnemonic == "input":
            return inputs[src.nodes[nid].op.name]  # type: ignore[attr-defined]
        raise QuantizationError(
            f"node %{nid} of graph {src.name!r} is not in the arena: only inputs and outputs "
            f"keep a slot there (outputs: {src.outputs}, inputs: {sorted(inputs)})"
        )

    def byte_offset(self, node: NodeId | str) -> int:
        """Offset in :attr:`buffer` of ``node``'s value (see the class docstring)."""
        return self._ex.arena_offset(self._node(node))

    def view(self, node: NodeId | str) -> np.ndarray:
        """``node``'s value in the arena, typed and shaped (read-only unless writable)."""
        v = self._ex.views[self._node(node)].view()
        v.flags.writeable = self.writable
        return v

    def write(self, node: NodeId | str, values: Any) -> None:
        """Copy ``values`` (same shape; cast to the node's dtype) into ``node``'s slot."""
        if not self.writable:
            raise QuantizationError("this arena view is read-only; use arena_mut() to write")
        dst = self._ex.views[self._node(node)]
        arr = np.asarray(values)
        if arr.shape != dst.shape:
            raise QuantizationError(
                f"arena write to {node!r}: expected shape {dst.shape}, given {arr.shape}"
            )
        np.copyto(dst, arr, casting="unsafe")


class StreamingHistogram:
    """Histogram of non-negative values over ``[0, hi)`` with ``bins`` bins (a power of
    two); ``hi`` is the smallest power of two above every value added (see the module
    docstring). The range is kept as a power-of-two exponent, so values up to the f64
    maximum are binned without overflow (``hi`` is then ``inf``: ``2**1024``)."""

    def __init__(self, bins: int = 2048):
        if bins < 2 or bins & (bins - 1):
            raise QuantizationError(f"histogram bins must be a power of two >= 2, got {bins}")
        self.bins = bins
        self._log2_bins = bins.bit_length() - 1
        self.counts = np.zeros(bins, np.int64)
        self._exp: int | None = None  # hi = 2**_exp
        self._zeros = 0  # values seen (all zero) before any range existed

    @property
    def hi(self) -> float | None:
        if self._exp is None:
            return None
        return math.ldexp(1.0, self._exp) if self._exp <= 1023 else math.inf

    @property
    def width(self) -> float:
        return 0.0 if self._exp is None else math.ldexp(1.0, self._exp - self._log2_bins)

    @property
    def total(self) -> int:
        return int(self.counts.sum()) + self._zeros

    def add(self, values: np.ndarray) -> None:
        """Add finite non-negative ``values`` (any shape); QuantizationError otherwise."""
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        if not v.size:
            return
        top = float(v.max())
        if not (math.isfinite(top) and float(v.min()) >= 0.0):
            raise QuantizationError(
                f"histogram values must be finite and >= 0, given range [{float(v.min())}, {top}]"
            )
        if top == 0.0 and self._exp is None:
            self._zeros += v.size
            return
        exp = math.frexp(top)[1]  # 2**exp is the smallest power of two > top
        if self._exp is None:
            self._exp = exp
            self.counts[0] += self._zeros
            self._zeros = 0
        elif exp > self._exp:
            self._grow(exp)
        # v * bins / 2**exp, scaled by exponent arithmetic (no 2**1024 overflow)
        idx = np.ldexp(v, self._log2_bins - self._exp).astype(np.int64)
        np.minimum(idx, self.bins - 1, out=idx)
        self.counts += np.bincount(idx, minlength=self.bins)

    def _grow(self, exp: int) -> None:
        assert self._exp is not None
        shift = exp - self._exp
        if shift >= self._log2_bins:
            merged = np.array([self.counts.sum()], np.int64)
        else:
            merged = self.counts.reshape(-1, 1 << shift).sum(axis=1)
        self.counts = np.zeros(self.bins, np.int64)
        self.counts[: merged.size] = merged
        self._exp = exp

    def percentile(self, q: float) -> float:
        """The upper edge of the bin holding the value of rank ``ceil(q / 100 * n)``
        (1-based, ``n`` values seen): the smallest value whose empirical CDF reaches ``q``
        percent, np.percentile's ``inverted_cdf``, within one bin width above it; at most
        the f64 maximum.

        The rank is computed exactly, with ``q`` read as the decimal it prints as (99.9,
        not the binary double just above it): in floating point ``99.9 / 100 * 1000`` is
        ``999.0000000000001``, whose ceiling moved the threshold up one rank (999 N(0,1)
        values and one 40.0 gave 40.0 at p99.9, not 3.3)."""
        if not 0.0 <= q <= 100.0:
            raise QuantizationError(f"percentile must be in [0, 100], got {q}")
        if self._exp is None:
            return 0.0
        cdf = np.cumsum(self.counts)
        rank = max(1, math.ceil(_percentile_fraction(q) * int(cdf[-1])))
        k = int(np.searchsorted(cdf, rank, side="left"))
        top = float(np.finfo(np.float64).max)
        try:
            return min(math.ldexp(float(min(k + 1, self.bins)), self._exp - self._log2_bins), top)
        except OverflowError:
            return top


def _percentile_fraction(q: float) -> Fraction:
    """``q / 100`` exactly, ``q`` read as the shortest decimal that prints as it (the
    percentile the caller wrote): ``Fraction(999, 1000)`` for 99.9."""
    return Fraction(repr(float(q))) / 100


def _as_f32_threshold(vals: Sequence[float], max_abs: np.ndarray) -> np.ndarray:
    """Thresholds (f64, possibly above the f32 range: a histogram's top edge can be
    2**128) capped at each tap's max-abs, as f32 without an overflowing cast."""
    capped = np.minimum(np.asarray(vals, np.float64), max_abs.astype(np.float64))
    return np.minimum(capped, _F32_MAX).astype(np.float32)


def kl_threshold(
    counts: np.ndarray,
    width: float,
    num_quant_bins: int = 128,
    *,
    start_bin: int | None = None,
) -> float:
    """TensorRT's entropy threshold for a histogram of ``|x|`` with bins of ``width``
    (the algorithm of NVIDIA pytorch-quantization's ``_compute_amax_entropy``).

    In: ``counts`` (bin ``j`` covers ``[j * width, (j + 1) * width)``); ``num_quant_bins``
    quantization levels over ``|x|`` (128 for symmetric int8). Out: the clipping
    threshold ``i * width`` of the candidate ``i`` with the least KL divergence ``KL(P||Q)``:

    * bin 0 is replaced by bin 1's count first: it holds the exact zeros (half of a ReLU
      output), which every threshold represents exactly; left in, their spike dominates
      the divergence and drags the threshold towards the smallest candidate;
    * candidates run from ``start_bin`` (default ``num_quant_bins``) to the last
      non-empty bin + 1;
    * ``P`` = the first ``i`` bins with the clipped mass (bins ``>= i``) added to the last;
    * ``Q`` = the first ``i`` bins (without the clipped mass) quantized into
      ``num_quant_bins`` levels (bin ``j`` goes to level ``floor(j * levels / i)``), each
      level's count spread evenly over its non-empty bins (empty bins stay empty);
    * ``KL`` sums over ``P > 0`` and is infinite where ``Q = 0 < P``; no smoothing;
    * ties go to the largest threshold.
    """
    src = np.asarray(counts, dtype=np.float64).reshape(-1).copy()
    n = src.size
    start = num_quant_bins if start_bin is None else start_bin
    if num_quant_bins < 1 or start < 1:
        raise QuantizationError(
            f"kl_threshold: num_quant_bins and start_bin must be >= 1, "
            f"given {num_quant_bins} and {start_bin}"
        )
    if n >= 2:
        src[0] = src[1]
    if src.sum() == 0 or n <= start:
        return n * width
    stop = int(np.nonzero(src)[0][-1]) + 1
    suffix = np.concatenate([np.cumsum(src[::-1])[::-1], [0.0]])  # suffix[i] = sum(src[i:])
    best_i, best_kl = n, math.inf
    for i in range(start, max(stop, start) + 1):
        head = src[:i]
        level = (np.arange(i) * num_quant_bins) // i
        nonempty = head > 0
        totals = np.bincount(level, weights=head, minlength=num_quant_bins)
        used = np.bincount(level, weights=nonempty, minlength=num_quant_bins)
        per_bin = np.divide(totals, used, out=np.zeros_like(totals), where=used > 0)
        q = np.where(nonempty, per_bin[level], 0.0)
        p = head.copy()
        p[-1] += suffix[i]
        live = p > 0
        if (q[live] == 0).any():
            continue  # infinite divergence
        pn, qn = p[live] / p.sum(), q[live] / q.sum()
        kl = float(np.sum(pn * np.log(pn / qn)))
        if kl <= best_kl:
            best_i, best_kl = i, kl
    return best_i * width


class _HistogramCalibrator(Calibrator):
    def __init__(
        self,
        compiled: CompiledGraph,
        taps: Sequence[NodeId],
        bins: int,
        *,
        channel_stats: bool = False,
    ):
        super().__init__(compiled, taps, channel_stats=channel_stats)
        self.histograms = [StreamingHistogram(bins) for _ in self.taps]

    def _observe(self, i: int, abs_values: np.ndarray) -> None:
        self.histograms[i].add(abs_values)


class PercentileCalibrator(_HistogramCalibrator):
    """Threshold = the ``percentile`` of ``|x|`` over all batches: the value of rank
    ``ceil(percentile / 100 * n)`` (np.percentile's ``inverted_cdf``, rank computed
    exactly), from the histogram, within one bin width above it; never above the
    max-abs."""

    def __init__(
        self,
        compiled: CompiledGraph,
        taps: Sequence[NodeId],
        percentile: float = 99.99,
        bins: int = 2048,
        *,
        channel_stats: bool = False,
    ):
        if not 0.0 < percentile <= 100.0:
            raise QuantizationError(f"percentile must be in (0, 100], got {percentile}")
        super().__init__(compiled, taps, bins, channel_stats=channel_stats)
        self.percentile = percentile

    def amax(self) -> np.ndarray:
        vals = [h.percentile(self.percentile) for h in self.histograms]
        return _as_f32_threshold(vals, self._max_abs)


class EntropyCalibrator(_HistogramCalibrator):
    """Threshold minimising the KL divergence of the 128-level quantized distribution of
    ``|x|`` (see :func:`kl_threshold`), never above the max-abs."""

    def __init__(
        self,
        compiled: CompiledGraph,
        taps: Sequence[NodeId],
        bins: int = 2048,
        num_quant_bins: int = 128,
        *,
        channel_stats: bool = False,
    ):
        if num_quant_bins < 2 or num_quant_bins > bins:
            raise QuantizationError(
                f"num_quant_bins must be in [2, bins={bins}], got {num_quant_bins}"
            )
        super().__init__(compiled, taps, bins, channel_stats=channel_stats)
        self.num_quant_bins = num_quant_bins

    def amax(self) -> np.ndarray:
        vals = [kl_threshold(h.counts, h.width, self.num_quant_bins) for h in self.histograms]
        return _as_f32_threshold(vals, self._max_abs)


def _progress(batches: Iterable[Any], enabled: bool) -> Iterable[Any]:
    if not enabled:
        return batches
    try:
        from tqdm.auto import tqdm
    except ImportError:  # the optional 'progress' extra is not installed
        return batches
    total = len(batches) if hasattr(batches, "__len__") else None  # type: ignore[arg-type]
    return tqdm(batches, total=total, desc="calibrate", unit="batch")


def calibrate(
    compiled: CompiledGraph,
    batches: Iterable[Mapping[str, Any]],
    method: CalibrationMethod = CalibrationMethod.MAX_ABS,
    *,
    taps: Sequence[NodeId] | None = None,
    progress: bool = True,
    percentile: float = 99.99,
    bins: int = 2048,
    channel_stats: bool = False,
) -> Calibrator:
    """Run ``method``'s calibrator over ``batches`` (input dicts); ``taps`` default to
    every output; ``channel_stats`` also keeps each tap's per-channel max ``|x|``.
    Returns the calibrator (``amax()``, ``scales()``, ``scale_map()``, ``min_max()``,
    ``channel_max_abs()``)."""
    if not isinstance(method, CalibrationMethod):
        raise QuantizationError(f"method must be a CalibrationMethod, got {method!r}")
    tap_ids = list(compiled.program.source.outputs) if taps is None else list(taps)
    cal: Calibrator
    if method is CalibrationMethod.MAX_ABS:
        cal = Calibrator(compiled, tap_ids, channel_stats=channel_stats)
    elif method is CalibrationMethod.PERCENTILE:
        cal = PercentileCalibrator(
            compiled, tap_ids, percentile=percentile, bins=bins, channel_stats=channel_stats
        )
    else:
        cal = EntropyCalibrator(compiled, tap_ids, bins=bins, channel_stats=channel_stats)
    for batch in _progress(batches, progress):
        cal.step(batch)
    if cal.batches == 0:
        raise QuantizationError(
            f"calibrate(): given no batches; expected at least one input dict with "
            f"the inputs of graph {compiled.program.source.name!r}: {compiled.input_names}"
        )
    return cal
