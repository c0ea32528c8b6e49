"""Signal-processing builders composed from primitive ops (no op class of their own): the
seed's ``fft_ops``. In: node ids and static parameters. Out: the id of the result node;
every helper only adds gather / pad / transpose / elementwise / reduce / ``Fft`` nodes.

* ``fftfreq(n, d)`` / ``rfftfreq(n, d)``: the sample frequencies of ``numpy.fft.fftfreq``
  / ``rfftfreq`` as an f32 (or ``dtype``) constant built now: ``n`` must be static.
* ``stft(x, n_fft, ...)``: ``torch.stft``'s short-time transform of real ``x[..., T]``:
  frames taken by one gather from the (centred, padded) signal, multiplied by the window,
  then ``rfft`` (or ``fft`` when not ``onesided``). Result ``c64[..., freq, frames]``, or
  ``f32[..., freq, frames, 2]`` (real, imaginary) with ``return_complex=False``.
* ``psd_real(x, fs, ...)``: the power spectral density of real ``x`` along ``axis`` as
  ``scipy.signal.periodogram`` (one segment) or ``scipy.signal.welch`` (``nperseg`` given:
  the mean over overlapping segments): ``|rfft(detrend(x) * w)|**2`` scaled by
  ``1/(fs*sum(w**2))`` (``density``) or ``1/sum(w)**2`` (``spectrum``), interior bins
  doubled (one-sided). f32 result.
* ``fft_conv1d(a, b, mode)``: linear convolution along the last axis as
  ``scipy.signal.fftconvolve(a, b, mode, axes=-1)`` (leading dims broadcast): rfft of both
  zero-padded to a fast length, product, irfft, slice (``full``, ``same``, ``valid``).

Frame counts, padding indices and frequency tables are computed when the graph is built,
so the transformed axis must be static: a symbolic length is a ShapeError saying so.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from rlx import source
from rlx.dtype import DType
from rlx.errors import ShapeError
from rlx.ops.base import graph_method
from rlx.ops.fft import FftNorm

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["fftfreq", "rfftfreq", "stft", "psd_real", "fft_conv1d"]

_PAD_MODES = ("reflect", "constant", "replicate", "circular")


def _fail(msg: str) -> ShapeError:
    return ShapeError(msg, loc=source.capture())


def _static_n(what: str, n: Any) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise _fail(
            f"{what}: n must be a static int (the table is built with the graph), got {n!r}"
        )
    if n < 1:
        raise _fail(f"{what}: n must be >= 1, got {n}")
    return int(n)


def _check_d(what: str, d: float) -> float:
    if not isinstance(d, (int, float, np.floating, np.integer)) or not d > 0:
        raise _fail(f"{what}: sample spacing d must be a number > 0, got {d!r}")
    return float(d)


@graph_method
def fftfreq(g: Graph, n: int, d: float = 1.0, dtype: DType | str = DType.F32) -> NodeId:
    """``numpy.fft.fftfreq(n, d)`` as a constant ``[n]`` of ``dtype`` (default f32)."""
    n = _static_n("fftfreq", n)
    return g.constant(np.fft.fftfreq(n, _check_d("fftfreq", d)), dtype)


@graph_method
def rfftfreq(g: Graph, n: int, d: float = 1.0, dtype: DType | str = DType.F32) -> NodeId:
    """``numpy.fft.rfftfreq(n, d)`` as a constant ``[n//2 + 1]`` of ``dtype``."""
    n = _static_n("rfftfreq", n)
    return g.constant(np.fft.rfftfreq(n, _check_d("rfftfreq", d)), dtype)


# ---- shared pieces ------------------------------------------------------------------


def _real_input(g: Graph, what: str, x: NodeId, name: str = "x") -> NodeId:
    s = g.shape(x)
    if s.rank == 0:
        raise _fail(f"{what}: {name} %{x} is a scalar {s}, it needs a signal axis")
    if not s.dtype.is_float:
        raise _fail(f"{what}: {name} %{x} must be a real float tensor, got {s}")
    return x if s.dtype is DType.F32 else g.cast(x, DType.F32)


def _static_len(g: Graph, what: str, x: NodeId, axis: int, name: str = "x") -> int:
    s = g.shape(x)
    d = s.dims[axis]
    if not isinstance(d, int):
        raise _fail(
            f"{what}: {name} %{x} {s} has the symbolic length {d} along axis {axis % s.rank}; "
            "frame counts and FFT sizes are fixed when the graph is built, so this axis "
            "must be static"
        )
    return d


def _window(g: Graph, what: str, window: Any, length: int) -> NodeId | None:
    """The window as an f32 ``[length]`` node (None: rectangular, no multiply)."""
    if window is None:
        return None
    if isinstance(window, int) and not isinstance(window, bool):
        s = g.shape(window)
        if s.dims != (length,) or not s.dtype.is_float:
            raise _fail(f"{what}: window %{window} must be a float [{length}] tensor, got {s}")
        return window if s.dtype is DType.F32 else g.cast(window, DType.F32)
    w = np.asarray(window)
    if w.shape != (length,) or w.dtype.kind not in "fiu":
        raise _fail(
            f"{what}: window must be a node id, None or a real array of shape ({length},), "
            f"got {type(window).__name__} of shape {getattr(w, 'shape', None)}"
        )
    return g.constant(w.astype(np.float32))


def _window_array(window: Any, g: Graph, length: int) -> np.ndarray | None:
    """The window's values when known at build time (an array), for the scale factors."""
    if window is None:
        return np.ones(length)
    if isinstance(window, int) and not isinstance(window, bool):
        from rlx.ops.core import Constant

        op = g.node(window).op
        return op.value.array().astype(np.float64) if isinstance(op, Constant) else None
    return np.asarray(window, dtype=np.float64)


def _pad_index(i: np.ndarray, n: int, mode: str) -> np.ndarray:
    """Map positions ``i`` of a padded signal (may be < 0 or >= n) to indices in ``[0, n)``."""
    if mode == "replicate":
        return np.clip(i, 0, n - 1)
    if mode == "circular":
        return np.mod(i, n)
    if n == 1:  # reflect
        return np.zeros_like(i)
    period = 2 * (n - 1)
    j = np.mod(i, period)
    return np.where(j < n, j, period - j)


def _frames(
    g: Graph, what: str, x: NodeId, frame: int, hop: int, pad: int, mode: str
) -> tuple[NodeId, int]:
    """``x[..., T]`` -> ``[..., frames, frame]``: frame ``f`` starts at ``f*hop`` of ``x``
    padded by ``pad`` on both sides (``mode`` as ``torch.nn.functional.pad``)."""
    t = _static_len(g, what, x, -1)
    rank = g.shape(x).rank
    if mode == "reflect" and pad >= t and pad > 0:
        raise _fail(f"{what}: reflect padding of {pad} needs a signal longer than {pad}, got {t}")
    if mode == "constant" and pad > 0:
        x = g.pad(x, [(0, 0)] * (rank - 1) + [(pad, pad)])
        t, pad = t + 2 * pad, 0
    total = t + 2 * pad
    if total < frame:
        raise _fail(f"{what}: the padded signal has {total} samples, fewer than one frame {frame}")
    count = 1 + (total - frame) // hop
    pos = np.arange(count)[:, None] * hop + np.arange(frame)[None, :] - pad
    idx = pos if pad == 0 else _pad_index(pos, t, mode)
    return g.gather(x, g.constant(idx.astype(np.int64)), axis=rank - 1), count


def _swap_last(g: Graph, x: NodeId) -> NodeId:
    r = g.shape(x).rank
    return g.transpose(x, [*range(r - 2), r - 1, r - 2])


def _real_imag(g: Graph, z: NodeId) -> NodeId:
    """c64 ``z`` -> f32 ``[..., 2]`` (real, imaginary), as ``torch.view_as_real``."""
    re = g.cast(z, DType.F32)
    im = g.cast(g.mul(z, g.constant(np.asarray(-1j, np.complex64))), DType.F32)
    r = g.shape(z).rank
    return g.concat([g.unsqueeze(re, r), g.unsqueeze(im, r)], axis=r)


# ---- stft ---------------------------------------------------------------------------


@graph_method
def stft(
    g: Graph,
    x: NodeId,
    n_fft: int,
    hop_length: int | None = None,
    win_length: int | None = None,
    window: NodeId | np.ndarray | None = None,
    center: bool = True,
    pad_mode: str = "reflect",
    normalized: bool = False,
    onesided: bool = True,
    return_complex: bool = True,
) -> NodeId:
    """``torch.stft`` of real ``x[..., T]`` (static T): ``c64[..., n_fft//2+1, frames]``
    (``n_fft`` bins when not ``onesided``), ``frames = 1 + (T + 2*(n_fft//2) - n_fft) //
    hop`` with ``center`` (``T`` without). ``hop_length`` defaults to ``n_fft // 4``,
    ``win_length`` to ``n_fft``; ``window`` (a node or array of ``win_length``, None:
    rectangular) is zero-padded to ``n_fft`` in the middle. ``normalized`` scales by
    ``n_fft**-0.5``; ``return_complex=False`` gives ``f32[..., freq, frames, 2]``."""
    n_fft = _static_n("stft: n_fft", n_fft)
    hop = n_fft // 4 if hop_length is None else hop_length
    if isinstance(hop, bool) or not isinstance(hop, int) or hop < 1:
        raise _fail(f"stft: hop_length must be an int >= 1, got {hop_length!r}")
    win = n_fft if win_length is None else win_length
    if isinstance(win, bool) or not isinstance(win, int) or not 1 <= win <= n_fft:
        raise _fail(f"stft: win_length must be an int in [1, n_fft={n_fft}], got {win_length!r}")
    if pad_mode not in _PAD_MODES:
        raise _fail(f"stft: pad_mode must be one of {list(_PAD_MODES)}, got {pad_mode!r}")
    x = _real_input(g, "stft", x)
    w = _window(g, "stft", window, win)
    if w is None and win < n_fft:
        w = g.constant(np.ones(win, np.float32))
    if w is not None and win < n_fft:
        left = (n_fft - win) // 2
        w = g.pad(w, [(left, n_fft - win - left)])
    frames, _ = _frames(g, "stft", x, n_fft, hop, n_fft // 2 if center else 0, pad_mode)
    if w is not None:
        frames = g.mul(frames, w)
    norm = FftNorm.ORTHO if normalized else FftNorm.BACKWARD
    spec = g.rfft(frames, norm=norm) if onesided else g.fft(frames, norm=norm)
    spec = _swap_last(g, spec)
    return spec if return_complex else _real_imag(g, spec)


# ---- power spectral density ----------------------------------------------------------


@graph_method
def psd_real(
    g: Graph,
    x: NodeId,
    fs: float = 1.0,
    window: NodeId | np.ndarray | None = None,
    nperseg: int | None = None,
    noverlap: int | None = None,
    nfft: int | None = None,
    detrend: str | None = "constant",
    scaling: str = "density",
    axis: int = -1,
) -> NodeId:
    """One-sided PSD of real ``x`` along ``axis`` (static length N): with ``nperseg=None``
    ``scipy.signal.periodogram(x, fs, window, nfft, detrend, True, scaling, axis)`` (one
    segment of N samples), else ``scipy.signal.welch`` (segments of ``nperseg`` every
    ``nperseg - noverlap``, default ``noverlap = nperseg // 2``, averaged). ``window``:
    a node or array of the segment length, None for a boxcar (periodogram's default; pass
    ``scipy.signal.get_window('hann', nperseg)`` for welch's). ``detrend``: "constant"
    (subtract each segment's mean) or None. Returns f32 ``[..., nfft//2+1, ...]`` with the
    frequency axis in place of ``axis``; frequencies: ``g.rfftfreq(nfft, 1/fs)``."""
    s = g.shape(x)
    if s.rank == 0:
        raise _fail(f"psd_real: x %{x} is a scalar {s}, it needs a signal axis")
    if not -s.rank <= axis < s.rank:
        raise _fail(f"psd_real: axis {axis} is out of range for %{x} {s}")
    ax = axis % s.rank
    n = _static_len(g, "psd_real", x, ax)
    fs = _check_d("psd_real: fs", fs)
    if detrend not in ("constant", None, False):
        raise _fail(f"psd_real: detrend must be 'constant' or None, got {detrend!r}")
    if scaling not in ("density", "spectrum"):
        raise _fail(f"psd_real: scaling must be 'density' or 'spectrum', got {scaling!r}")
    seg = n if nperseg is None else _static_n("psd_real: nperseg", nperseg)
    if seg > n:
        raise _fail(f"psd_real: nperseg={seg} exceeds the signal length {n}")
    over = seg // 2 if noverlap is None else noverlap
    if nperseg is None:
        over = 0
    if isinstance(over, bool) or not isinstance(over, int) or not 0 <= over < seg:
        raise _fail(f"psd_real: noverlap must be an int in [0, nperseg={seg}), got {noverlap!r}")
    nf = seg if nfft is None else _static_n("psd_real: nfft", nfft)
    if nf < seg:
        raise _fail(f"psd_real: nfft={nf} is shorter than the segment length {seg}")
    w_vals = _window_array(window, g, seg)
    if w_vals is None:
        raise _fail(
            "psd_real: a window node must be a constant (its sums set the scale); pass an array"
        )
    w = _window(g, "psd_real", window, seg)

    x = _real_input(g, "psd_real", x)
    moved = ax != s.rank - 1
    if moved:
        perm = [i for i in range(s.rank) if i != ax] + [ax]
        x = g.transpose(x, perm)
    if nperseg is None:
        frames = g.unsqueeze(x, s.rank - 1)  # [..., 1, N]
    else:
        frames, _ = _frames(g, "psd_real", x, seg, seg - over, 0, "constant")
    if detrend:
        frames = g.sub(frames, g.mean(frames, axes=-1, keepdims=True))
    if w is not None:
        frames = g.mul(frames, w)
    spec = g.rfft(frames, n=nf)
    power = g.cast(g.abs(spec), DType.F32)
    power = g.mul(power, power)
    if scaling == "density":
        scale = 1.0 / (fs * float(np.sum(w_vals * w_vals)))
    else:
        scale = 1.0 / float(np.sum(w_vals)) ** 2
    bins = nf // 2 + 1
    factor = np.full(bins, 2.0 * scale)
    factor[0] = scale
    if nf % 2 == 0:
        factor[-1] = scale
    power = g.mul(power, g.constant(factor.astype(np.float32)))
    out = g.mean(power, axes=-2)  # over the segments: [..., bins]
    if moved:
        r = s.rank
        back = list(range(r - 1))
        back.insert(ax, r - 1)
        out = g.transpose(out, back)
    return out


# ---- convolution ---------------------------------------------------------------------

_CONV_MODES = ("full", "same", "valid")


@graph_method
def fft_conv1d(g: Graph, a: NodeId, b: NodeId, mode: str = "full") -> NodeId:
    """Linear convolution of real ``a[..., La]`` and ``b[..., Lb]`` along the last axis,
    as ``scipy.signal.fftconvolve(a, b, mode, axes=-1)``: leading dims broadcast; ``full``
    gives ``La+Lb-1`` samples, ``same`` the centred ``La``, ``valid`` the
    ``max-min+1`` samples where one input fully overlaps the other. f32 result."""
    if mode not in _CONV_MODES:
        raise _fail(f"fft_conv1d: mode must be one of {list(_CONV_MODES)}, got {mode!r}")
    a = _real_input(g, "fft_conv1d", a, "a")
    b = _real_input(g, "fft_conv1d", b, "b")
    la = _static_len(g, "fft_conv1d", a, -1, "a")
    lb = _static_len(g, "fft_conv1d", b, -1, "b")
    if la == 0 or lb == 0:
        raise _fail(f"fft_conv1d: inputs must be non-empty, got lengths {la} and {lb}")
    full = la + lb - 1
    import scipy.fft  # (on first use)

    nf = scipy.fft.next_fast_len(full, real=True)
    prod = g.mul(g.rfft(a, n=nf), g.rfft(b, n=nf))
    y = g.irfft(prod, n=nf)
    if mode == "full":
        start, length = 0, full
    elif mode == "same":
        start, length = (full - la) // 2, la
    else:
        start, length = min(la, lb) - 1, max(la, lb) - min(la, lb) + 1
    if start == 0 and length == nf:
        return y
    r = g.shape(y).rank
    return g.narrow(y, r - 1, start, length)
