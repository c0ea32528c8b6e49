"""CPU kernels of ``rope_norm`` and ``norm_add`` (``rlx/ops/decoder.py``). In: the node and its arena
views. Out: a closure writing the output view.

* Native (f32 with i64 positions): one C function walks the tokens and heads: the table
  rows at the token's position, the head's RMS norm (sum of squares in 16 f32 partial sums;
  ``x / sqrt(mean + eps) * w`` as the reference), then the rotation of the first ``n_rot``
  dims, the rest copied. It carries a ``native_call``, so a decode step's schedule runs it
  inside its native segments (:mod:`rlx.backends.cpu.native.schedule`) with no Python call.
  A position outside the tables returns 1; the closure then raises the InputError.
  The C text is built here for the selected target (cached by content).
* Native ``norm_add`` (f32): per row the sum of squares (16 f32 partial sums), then
  ``r + x / sqrt(mean + eps) * w``, also with a ``native_call``.
* NumPy (other dtypes, i32 positions, no gcc): the reference functions on the views,
  low-precision inputs widened to f32.
"""

from __future__ import annotations

import ctypes
import functools
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.backends.cpu.dispatch import Kernel, KernelCtx, KernelKind, kind, lowp
from rlx.ops.decoder import NormAdd, RopeNorm, norm_add_reference, rope_norm_reference

if TYPE_CHECKING:
    from rlx.ir.mir import Node

__all__ = [
    "native_norm_add_kernel",
    "native_rope_norm_kernel",
    "norm_add_kernel",
    "rope_norm_kernel",
    "SOURCE",
]

#: the native kernel's C source
SOURCE = r"""
#include <math.h>
#include <stdint.h>

/* sum of v[i]^2 in 16 interleaved f32 partial sums (lane j adds i = j mod 16, in order),
   then the 16 in order: a fixed order the compiler vectorises */
static float sum_sq(const float *v, long n) {
  float acc[16] = {0};
  long i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; j++) acc[j] += v[i + j] * v[i + j];
  for (int j = 0; i < n; i++, j++) acc[j] += v[i] * v[i];
  float s = 0.0f;
  for (int j = 0; j < 16; j++) s += acc[j];
  return s;
}

int rlx_rope_norm_f32(const float *x, const float *cos_t, const float *sin_t,
                      const int64_t *pos, const float *w, float *out, long batch, long seq,
                      long heads, long d, long rot, long rows, long interleaved, float eps) {
  long half = rot / 2;
  float buf[d];
  for (long t = 0; t < seq; t++)
    if (pos[t] < 0 || pos[t] >= rows) return 1;
  for (long b = 0; b < batch; b++)
    for (long t = 0; t < seq; t++) {
      const float *c = cos_t + pos[t] * half, *sn = sin_t + pos[t] * half;
      for (long h = 0; h < heads; h++) {
        long at = ((b * seq + t) * heads + h) * d;
        const float *v = x + at;
        float *o = out + at;
        if (w) {
          float r = sqrtf(sum_sq(v, d) / (float)d + eps);
          for (long i = 0; i < d; i++) buf[i] = v[i] / r * w[i];
          v = buf;
        }
        for (long i = rot; i < d; i++) o[i] = v[i];
        if (interleaved) {
          for (long i = 0; i < half; i++) {
            float a = v[2 * i], bb = v[2 * i + 1];
            o[2 * i] = a * c[i] - bb * sn[i];
            o[2 * i + 1] = bb * c[i] + a * sn[i];
          }
        } else {
          for (long i = 0; i < half; i++) {
            float a = v[i], bb = v[i + half];
            o[i] = a * c[i] - bb * sn[i];
            o[i + half] = bb * c[i] + a * sn[i];
          }
        }
      }
    }
  return 0;
}

int rlx_norm_add_f32(const float *x, const float *w, const float *r, float *out, long rows,
                     long n, float eps) {
  for (long j = 0; j < rows; j++) {
    const float *v = x + j * n, *res = r + j * n;
    float *o = out + j * n;
    float q = sqrtf(sum_sq(v, n) / (float)n + eps);
    for (long i = 0; i < n; i++) o[i] = res[i] + v[i] / q * w[i];
  }
  return 0;
}
"""


@functools.cache
def _lib(target: Any) -> ctypes.CDLL:
    from rlx.backends.cpu.native.bindings import library

    return library(SOURCE, target, "rope_norm")


def _ptr(a: np.ndarray | None) -> int:
    return 0 if a is None else int(a.ctypes.data)


@kind(KernelKind.NATIVE)
def native_rope_norm_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The C loop of the module docstring (None: not f32 / i64, or no native library)."""
    from rlx.backends.cpu.native import cpu
    from rlx.backends.cpu.native.bindings import lib_or_note

    op: RopeNorm = node.op  # type: ignore[assignment]
    f32 = np.dtype(np.float32)
    floats = [ins[0], ins[1], ins[2], out, *ins[4:]]
    if any(a.dtype != f32 for a in floats) or ins[3].dtype != np.int64:
        return None
    if not all(a.flags.c_contiguous for a in (*ins, out)):
        return None
    lib = lib_or_note(ctx, "rope_norm", lambda: _lib(cpu.selected_target()))
    if lib is None:
        return None
    x, cos, sin, pos = ins[:4]
    w = ins[4] if len(ins) == 5 else None
    b, s, hd = x.shape
    fn = lib.rlx_rope_norm_f32
    args = (
        _ptr(x), _ptr(cos), _ptr(sin), _ptr(pos), _ptr(w), _ptr(out), b, s,
        hd // op.head_dim, op.head_dim, op.n_rot, cos.shape[0], int(op.interleaved),
        ctypes.c_float(op.eps),
    )  # fmt: skip
    keep = (ins, out)

    def run() -> None:
        if fn(*args) != 0:  # a position outside the tables: the reference names it
            rope_norm_reference(*keep[0][:4], w, op.head_dim, op.n_rot, op.interleaved, op.eps)

    run.native_call = (fn, args, True)  # type: ignore[attr-defined]
    ctx.notes.append(f"native rope_norm over {s} tokens x {hd // op.head_dim} heads")
    return run


@lowp
def rope_norm_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The reference function on the views (f32 / f64; low precision widened)."""
    op: RopeNorm = node.op  # type: ignore[assignment]
    w = ins[4] if len(ins) == 5 else None

    def run() -> None:
        y = rope_norm_reference(
            ins[0], ins[1], ins[2], ins[3], w, op.head_dim, op.n_rot, op.interleaved, op.eps
        )
        np.copyto(out, y, casting="unsafe")

    return run


@kind(KernelKind.NATIVE)
def native_norm_add_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The C loop of the module docstring (None: not f32, or no native library)."""
    from rlx.backends.cpu.native import cpu
    from rlx.backends.cpu.native.bindings import lib_or_note

    op: NormAdd = node.op  # type: ignore[assignment]
    if any(a.dtype != np.float32 or not a.flags.c_contiguous for a in (*ins, out)):
        return None
    lib = lib_or_note(ctx, "norm_add", lambda: _lib(cpu.selected_target()))
    if lib is None:
        return None
    x, w, r = ins
    n = out.shape[-1]
    fn = lib.rlx_norm_add_f32
    args = (_ptr(x), _ptr(w), _ptr(r), _ptr(out), out.size // max(n, 1), n, ctypes.c_float(op.eps))
    run = functools.partial(fn, *args)  # the arena views outlive the schedule
    ctx.notes.append(f"native norm_add over {out.size // max(n, 1)} rows of {n}")
    return run


@lowp
def norm_add_kernel(
    node: Node, ins: list[np.ndarray], out: np.ndarray, ctx: KernelCtx
) -> Kernel | None:
    """The reference function on the views (f32 / f64; low precision widened)."""
    eps = node.op.eps  # type: ignore[attr-defined]

    def run() -> None:
        np.copyto(out, norm_add_reference(ins[0], ins[1], ins[2], eps), casting="unsafe")

    return run


# each op's kernel factories, in the order they are tried
ATTEMPTS = {
    RopeNorm: (native_rope_norm_kernel, rope_norm_kernel),
    NormAdd: (native_norm_add_kernel, norm_add_kernel),
}
