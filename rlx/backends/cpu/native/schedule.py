"""Whole-schedule native execution. In: a kernel schedule (zero-argument callables, the
executor's closures). Out: the same schedule where every run of two or more consecutive
native kernels is one call into C, which walks an array of kernel descriptors and calls
each kernel's function with its bound arguments: no Python, no ctypes argument
conversion between them.

A kernel takes part when it says which C function and arguments it is:

* a ``functools.partial`` of a ctypes function with every argument bound (what
  ``engines.region.bind`` and the row kernels return), or
* any callable with a ``native_call`` attribute ``(ctypes function, args, checked)``:
  calling the kernel is exactly ``function(*args)``; ``checked``: a non-zero (int)
  return means failure (the Python kernel is then run to raise its error).

and its arguments are integers or pointers (``c_void_p``, ``c_long``, ``c_int``, ...) and
at most 8 ``c_float`` / ``c_double``. The C side (:func:`render`) casts the function to a
prototype of ``ni`` int64 and ``nf`` double parameters: on the x86-64 System V ABI the
integer-class arguments take the integer registers and then the stack in order, and the
floating ones the xmm registers in order, whatever their positions, so that call passes
each argument where the real prototype expects it (a ``float`` is its bits in the low half
of the xmm register).

AAPCS64 (Linux aarch64) does the same with other registers (:class:`CallConv`): integer
and pointer arguments in x0-x7 then the stack, each stack argument in an 8-byte slot
(a narrower one at the slot's low address, little-endian), floating ones in v0-v7 (a
``float`` is ``s<n>``, the low 32 bits of ``d<n>``); at most 8 of them, so none goes to
the stack. Callees read only the low bits of a narrower integer register. So the same
casts hold. Apple's arm64 ABI packs stack arguments by their own size (a 4-byte ``int``
takes 4 bytes there): on macOS a kernel whose 9th or later integer argument is narrower
than 8 bytes stays a Python call (:func:`native_call` returns None for it). Other
machines (and Windows): no native schedule.

The descriptor array is int64: per kernel ``[function, ni | nf << 8 | checked << 16,
ni args, nf float bit patterns]``. The library is built by :func:`rlx.backends.cpu.native.build`
(cached by content, like the regions). The Python schedule stays the oracle: profiling,
failure location and the ``CompileOptions(native_schedule=False)`` path run it.
"""

from __future__ import annotations

import ctypes
import enum
import functools
import platform
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from rlx.errors import CompileError

__all__ = [
    "CallConv",
    "call_convention",
    "native_call",
    "segments",
    "Segment",
    "MAX_INT_ARGS",
    "MAX_FLOAT_ARGS",
    "render",
]

MAX_INT_ARGS = 24
MAX_FLOAT_ARGS = 8
MIN_SEGMENT = 2  # a lone native kernel gains nothing from the C loop

_INTS = {
    ctypes.c_void_p,
    ctypes.c_char_p,
    ctypes.c_bool,
    ctypes.c_byte,
    ctypes.c_ubyte,
    ctypes.c_short,
    ctypes.c_ushort,
    ctypes.c_int,
    ctypes.c_uint,
    ctypes.c_long,
    ctypes.c_ulong,
    ctypes.c_longlong,
    ctypes.c_ulonglong,
    ctypes.c_size_t,
    ctypes.c_ssize_t,
}
_FLOATS = {ctypes.c_float: "<f", ctypes.c_double: "<d"}
_RESULTS = {None, ctypes.c_int, ctypes.c_long, ctypes.c_longlong, ctypes.c_int64, ctypes.c_int32}


_I64 = (-(1 << 63), 1 << 63)
_INT_REGS = 8  # integer argument registers of AAPCS64 (x0-x7); System V has 6


class CallConv(enum.Enum):
    """The C calling convention the descriptor loop relies on (see the module docstring);
    NONE: this machine has no native schedule."""

    SYSV_X86_64 = "x86-64 System V"
    AAPCS64 = "AAPCS64"
    APPLE_ARM64 = "Apple arm64"
    NONE = "none"


def call_convention(machine: str | None = None, system: str | None = None) -> CallConv:
    """The calling convention of ``machine`` / ``system`` (``platform.machine()`` and
    ``platform.system()`` strings; default: this machine's)."""
    m = platform.machine() if machine is None else machine
    sysname = platform.system() if system is None else system
    if sysname == "Windows":
        return CallConv.NONE
    if m in ("x86_64", "amd64"):
        return CallConv.SYSV_X86_64
    if m in ("aarch64", "arm64"):
        return CallConv.APPLE_ARM64 if sysname == "Darwin" else CallConv.AAPCS64
    return CallConv.NONE


_CONV = call_convention()


def _int_value(a: Any) -> int | None:
    v = a.value if isinstance(a, ctypes._SimpleCData) else a  # type: ignore[attr-defined]
    if type(v) is int and _I64[0] <= v < _I64[1]:
        return v  # the common case: a pointer or a count
    if v is None:
        return 0
    if isinstance(v, (bool, int, np.integer)):
        v = int(v) & 0xFFFF_FFFF_FFFF_FFFF
        return v - (1 << 64) if v >> 63 else v
    return None


def _float_bits(a: Any, fmt: str) -> int | None:
    v = getattr(a, "value", a)
    if not isinstance(v, (int, float, np.floating, np.integer)) or isinstance(v, bool):
        return None
    bits = int.from_bytes(struct.pack(fmt, float(v)), "little")
    return bits - (1 << 64) if bits >> 63 else bits


def native_call(
    kernel: Callable[[], Any], conv: CallConv | None = None
) -> tuple[int, list[int], int] | None:
    """``(function address, descriptor words, header)`` when ``kernel`` is one C call the
    descriptor loop can make under the calling convention ``conv`` (default: this
    machine's; see the module docstring), else None."""
    spec = getattr(kernel, "native_call", None)
    if spec is not None:
        fn, args, checked = spec
    elif (
        isinstance(kernel, functools.partial)
        and isinstance(kernel.func, ctypes._CFuncPtr)  # type: ignore[attr-defined]
        and not kernel.keywords
    ):
        fn, args, checked = kernel.func, kernel.args, False
    else:
        return None
    types = getattr(fn, "argtypes", None)
    if types is None or len(types) != len(args) or fn.restype not in _RESULTS:
        return None
    if checked and fn.restype is None:
        return None
    ints: list[int] = []
    floats: list[int] = []
    apple = (_CONV if conv is None else conv) is CallConv.APPLE_ARM64
    for t, a in zip(types, args, strict=True):
        if t is ctypes.c_void_p or t is ctypes.c_long:  # most arguments: no lookups
            v = _int_value(a)
            dest = ints
        elif t in _FLOATS:
            v = _float_bits(a, _FLOATS[t])
            dest = floats
        elif t in _INTS or (isinstance(t, type) and issubclass(t, ctypes._Pointer)):  # type: ignore[attr-defined]
            v = _int_value(a)
            dest = ints
            if len(ints) >= _INT_REGS and ctypes.sizeof(t) < 8 and apple:
                return None  # packed into fewer than 8 stack bytes there
        else:
            return None
        if v is None:
            return None
        dest.append(v)
    if len(ints) > MAX_INT_ARGS or len(floats) > MAX_FLOAT_ARGS:
        return None
    addr = ctypes.cast(fn, ctypes.c_void_p).value
    if not addr:
        return None
    header = len(ints) | len(floats) << 8 | int(bool(checked)) << 16
    return addr, ints + floats, header


def render() -> str:
    """The C source of ``rlx_run_schedule(const int64_t *desc, int64_t n)``: runs the
    ``n`` kernels of ``desc``; returns -1, or the index of the first checked kernel that
    returned non-zero (it stops there)."""
    cases = []
    for nf in range(MAX_FLOAT_ARGS + 1):
        for ni in range(MAX_INT_ARGS + 1):
            params = ", ".join(["I"] * ni + ["D"] * nf) or "void"
            args = ", ".join([f"a[{i}]" for i in range(ni)] + [f"d({ni + j})" for j in range(nf)])
            cases.append(f"    case {ni | nf << 8}: return ((I (*)({params}))fn)({args});")
    body = "\n".join(cases)
    # -O1 for this file (a pragma: native.build's command line is the same for every
    # library): gcc takes 0.23 s instead of 0.69 s at -O3 on its 225-case switch, which
    # matters on a cold start (issue 31); the loop costs 1-1.5 ns more per kernel
    # (measured 4.1-5.2 vs 3.3-3.4 ns a kernel), under 1 us per MiniLM forward.
    return f"""#pragma GCC optimize ("O1")
#include <stdint.h>
#include <string.h>
typedef int64_t I;
typedef double D;
#define d(k) bits_to_double(a[k])
static inline D bits_to_double(I v) {{ D x; memcpy(&x, &v, sizeof x); return x; }}
static I call(void *fn, I shape, const I *a) {{
  switch (shape) {{
{body}
    default: return -1;
  }}
}}
I rlx_run_schedule(const I *desc, I n) {{
  const I *p = desc;
  for (I k = 0; k < n; k++) {{
    I head = p[1];
    I ni = head & 0xff, nf = (head >> 8) & 0xff;
    I r = call((void *)p[0], head & 0xffff, p + 2);
    if (((head >> 16) & 1) && (int32_t)r != 0) return k;
    p += 2 + ni + nf;
  }}
  return -1;
}}
"""


@functools.cache
def _runner() -> Any:
    from rlx.backends.cpu import native

    if _CONV is CallConv.NONE:
        raise CompileError(
            f"the native schedule needs the x86-64 System V or the AAPCS64 calling "
            f"convention (this is {platform.machine()} on {platform.system()})"
        )
    if not native.available():
        raise CompileError("the native schedule needs gcc, which is not on PATH")
    lib = native.load(native.build(render(), native.Isa.PLAIN, "schedule"))
    fn = lib.rlx_run_schedule
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    fn.restype = ctypes.c_int64
    return fn


class Segment:
    """Consecutive native kernels run by one C call; ``kernels`` are their Python
    closures (kept: they own the arrays the descriptors point into)."""

    __slots__ = ("kernels", "desc", "_call")

    def __init__(self, kernels: Sequence[Callable[[], Any]], words: list[int]):
        self.kernels = tuple(kernels)
        self.desc = np.array(words, dtype=np.int64)
        self._call = functools.partial(
            _runner(), ctypes.c_void_p(self.desc.ctypes.data), ctypes.c_int64(len(kernels))
        )

    def __call__(self) -> None:
        k = self._call()
        if k >= 0:  # a checked kernel failed: its Python closure raises the error
            for f in self.kernels[k:]:
                f()


def segments(schedule: Sequence[Callable[[], Any]]) -> list[Callable[[], Any]]:
    """``schedule`` with each run of at least :data:`MIN_SEGMENT` consecutive native
    kernels replaced by one :class:`Segment` (the schedule itself when the native
    runner cannot be built)."""
    try:
        _runner()
    except CompileError:
        return list(schedule)
    out: list[Callable[[], Any]] = []
    run: list[Callable[[], Any]] = []
    words: list[int] = []

    def flush() -> None:
        if len(run) >= MIN_SEGMENT:
            out.append(Segment(run, words))
        else:
            out.extend(run)
        run.clear()
        words.clear()

    for f in schedule:
        spec = native_call(f)
        if spec is None:
            flush()
            out.append(f)
            continue
        addr, args, header = spec
        run.append(f)
        words.extend((addr, header, *args))
    flush()
    return out
