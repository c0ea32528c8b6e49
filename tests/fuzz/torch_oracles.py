"""PyTorch (float64) forms of the neural-network ops, written here from the ops' documented
definitions with torch's own functions, so that ``torch.autograd`` / ``torch.func.jvp``
give the oracles of their derivative ops (tests/fuzz/test_ops_grad.py) and the functions
themselves those of the forward ops (tests/fuzz/test_ops_nn.py). Nothing here calls rlx.

* :func:`attention`: packed heads ``[B, S, H*D]``, grouped-query kv heads (query head ``h``
  reads kv head ``h // (H / Hkv)``), an additive mask, causal / sliding-window visibility
  aligned to the end (query ``i`` sees key ``j`` when ``j <= i + Skv - Sq`` and, with a
  window ``w``, ``j > i + Skv - Sq - w``);
* :func:`rope`: rotate-half (NeoX) or interleaved pairs of the first ``n_rot`` dims;
* :func:`conv`: ``F.conv1d`` / ``F.conv2d`` after an explicit (lo, hi) zero pad;
* :func:`pool`: max over ``-inf``-padded windows (``F.max_pool``), or the average over
  each window's real elements (window sums over zero padding divided by the count of real
  elements, as PyTorch's ``count_include_pad=False``).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

__all__ = ["t64", "visible", "attention", "rope", "conv", "pool"]


def t64(a: np.ndarray, grad: bool = False) -> torch.Tensor:
    """A float64 torch tensor of ``a`` (a copy), optionally requiring grad."""
    return torch.tensor(np.asarray(a, np.float64), dtype=torch.float64, requires_grad=grad)


def visible(sq: int, skv: int, kind: str, window: int = 0) -> np.ndarray:
    """Bool [sq, skv]: which keys each query sees (kind none / causal / window / custom)."""
    i = np.arange(sq)[:, None] + (skv - sq)
    j = np.arange(skv)[None, :]
    if kind in ("none", "custom"):
        return np.ones((sq, skv), bool)
    ok = j <= i
    if kind == "window":
        ok &= j > i - window
    return ok


def attention(q, k, v, mask, heads: int, kv_heads: int, scale: float, vis: np.ndarray):
    """``softmax(q kᵀ scale + mask) v`` with hidden keys at ``-inf`` (a row with no
    visible key is 0); returns (out, scores of shape [B, H, Sq, Skv] as a leaf-free
    intermediate)."""
    b, sq, hd = q.shape
    skv = k.shape[1]
    d = hd // heads
    rep = heads // kv_heads
    qh = q.reshape(b, sq, heads, d).permute(0, 2, 1, 3)
    kh = k.reshape(b, skv, kv_heads, d).permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    vh = v.reshape(b, skv, kv_heads, d).permute(0, 2, 1, 3).repeat_interleave(rep, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    s = s.masked_fill(~torch.as_tensor(vis), float("-inf"))
    # a query that sees no key gives 0 (and no gradient), as ONNX specifies: its scores
    # are replaced by finite ones before the softmax, its probabilities by 0 after
    empty = torch.isneginf(s).all(dim=-1, keepdim=True)
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1)
    p = torch.where(empty, torch.zeros_like(p), p)
    o = torch.matmul(p, vh)
    return o.permute(0, 2, 1, 3).reshape(b, sq, heads * d)


def rope(x, cos, sin, head_dim: int, n_rot: int, interleaved: bool):
    """Rotary embedding of ``x [B, S, H*head_dim]`` with tables ``[S, n_rot/2]``."""
    b, s, hd = x.shape
    xh = x.reshape(b, s, hd // head_dim, head_dim)
    if interleaved:
        a, bb = xh[..., 0:n_rot:2], xh[..., 1:n_rot:2]
    else:
        a, bb = xh[..., : n_rot // 2], xh[..., n_rot // 2 : n_rot]
    c, sn = cos[None, :, None, :], sin[None, :, None, :]
    ra, rb = a * c - bb * sn, bb * c + a * sn
    if interleaved:
        rot = torch.stack([ra, rb], dim=-1).reshape(b, s, hd // head_dim, n_rot)
    else:
        rot = torch.cat([ra, rb], dim=-1)
    return torch.cat([rot, xh[..., n_rot:]], dim=-1).reshape(b, s, hd)


def _pad(x, pads, value: float):
    flat: list[int] = []
    for lo, hi in reversed(pads):  # F.pad lists the last dim first
        flat += [lo, hi]
    return F.pad(x, flat, value=value)


def conv(x, w, stride, pads, dilation, groups: int, bias=None):
    """Cross-correlation of ``x [N, C, *sp]`` with ``w [O, C/g, *k]`` (1-D or 2-D)."""
    fn = F.conv1d if w.dim() == 3 else F.conv2d
    return fn(_pad(x, pads, 0.0), w, bias, stride=stride, dilation=dilation, groups=groups)


def pool(x, fn: str, window, stride, pads):
    """Max or average (real elements only) pooling of ``x [N, C, *sp]``."""
    nd = len(window)
    if fn == "max":
        mp = F.max_pool1d if nd == 1 else F.max_pool2d
        return mp(_pad(x, pads, float("-inf")), window, stride)
    ap = F.avg_pool1d if nd == 1 else F.avg_pool2d
    area = float(np.prod(window))
    total = ap(_pad(x, pads, 0.0), window, stride) * area
    ones = torch.ones((1, 1, *x.shape[2:]), dtype=x.dtype)
    count = ap(_pad(ones, pads, 0.0), window, stride) * area
    return total / count
