"""The ctypes signatures of the C entry points, read from their prototypes. In: the C source
text a library was built from (``native.csrc_source``). Out: one signature table per C
file, ``{name: (restype, argtypes)}`` for every function it exports (a definition or
declaration at file scope named ``rlx_*`` that is not ``static``), and :func:`library`,
which builds, loads and types a library from it.

The C text is the one source of truth: a changed prototype changes what Python passes,
with nothing to keep in step by hand. The mapping is by C type: any pointer is
``c_void_p`` (callers pass addresses, ``ndarray.ctypes.data``, or ``byref``), ``int`` /
``int32_t`` is ``c_int``, ``long`` / ``int64_t`` is ``c_long`` (the same type on the LP64
targets rlx builds for), ``float`` / ``double`` are ``c_float`` / ``c_double``; a scalar
type without an entry in :data:`SCALARS` is an error naming the function, never a guess.
Functions a macro defines (``RLX_ADAM(rlx_adam_update_f32, float, sqrtf)``) are typed by
the prototype declared next to the macro's uses. Two prototypes of one name (``#if``
variants, a declaration and its definition) must agree.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from rlx.errors import CompileError

if TYPE_CHECKING:
    from rlx.backends.cpu.dispatch import KernelCtx

__all__ = [
    "SCALARS",
    "Signature",
    "signatures",
    "typed",
    "library",
    "csrc_library",
    "lib_or_note",
]

Signature = tuple[Any, tuple[Any, ...]]  # (restype or None, argtypes)

#: C scalar type -> ctypes type (pointers of any type are c_void_p)
SCALARS: dict[str, Any] = {
    "void": None,
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "long": ctypes.c_long,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_CONTINUED = re.compile(r"\\\n")
# a prototype at file scope: return type, name, parameters, then a body or a semicolon
_PROTO = re.compile(
    r"^(?P<static>static\s+)?(?:inline\s+)?(?P<ret>[A-Za-z_][\w\s]*?\**)\s*\b(?P<name>rlx_\w+)"
    r"\s*\((?P<params>[^()]*)\)\s*(?=[{;])",
    re.M,
)


def _ctype(decl: str, where: str, named: bool = True) -> Any:
    """The ctypes type of one C declaration (``const float *x``, ``long n``; ``named``:
    whether a parameter name follows the type, when it has more than one word)."""
    if "*" in decl:
        return ctypes.c_void_p
    words = [w for w in decl.split() if w not in ("const", "volatile", "restrict")]
    if not words:
        raise CompileError(f"{where}: an empty declaration")
    base = " ".join(words[:-1] if named and len(words) > 1 else words)
    if base not in SCALARS:
        raise CompileError(f"{where}: no ctypes type for the C type {base!r} (add it to SCALARS)")
    return SCALARS[base]


def _parse(proto: re.Match[str]) -> Signature:
    name = proto["name"]
    ret = _ctype(proto["ret"], f"{name}'s result", named=False)
    params = " ".join(proto["params"].split())
    if params in ("", "void"):
        return ret, ()
    args = tuple(_ctype(p, f"{name}'s parameter {p.strip()!r}") for p in params.split(","))
    return ret, args


@functools.cache
def signatures(source: str) -> dict[str, Signature]:
    """``{name: (restype, argtypes)}`` of every function ``source`` exports (see the module
    docstring). CompileError when two prototypes of one name disagree or a type has no
    ctypes entry."""
    text = _CONTINUED.sub(" ", _COMMENT.sub(" ", source))
    found: dict[str, Signature] = {}
    for m in _PROTO.finditer(text):
        if m["static"] or m["ret"].split()[0] in ("#define", "return"):
            continue
        sig = _parse(m)
        if found.setdefault(m["name"], sig) != sig:
            raise CompileError(f"{m['name']}: two prototypes disagree ({found[m['name']]}, {sig})")
    return found


def typed(lib: ctypes.CDLL, source: str) -> ctypes.CDLL:
    """Set ``restype`` and ``argtypes`` of every function of ``source`` on ``lib``."""
    for name, (restype, argtypes) in signatures(source).items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = list(argtypes)
    return lib


def library(source: str, target: Any, name: str) -> ctypes.CDLL:
    """Build ``source`` for ``target`` (cached by content), load it and type its entry
    points. CompileError without gcc or when the build fails; OSError when it cannot be
    loaded."""
    from rlx.backends.cpu import native

    if not native.available():
        raise CompileError(f"the native {name} library needs gcc, which is not on PATH")
    return typed(native.load(native.build(source, target, name)), source)


@functools.cache
def csrc_library(files: tuple[str, ...], target: Any, name: str, defines: str = "") -> ctypes.CDLL:
    """:func:`library` of ``defines`` + ``csrc/<files>`` (one per target and name, loaded
    once per process)."""
    from rlx.backends.cpu import native

    return library(defines + native.csrc_source(*files), target, name)


T = TypeVar("T")


def lib_or_note(ctx: KernelCtx, what: str, load: Callable[[], T]) -> T | None:
    """``load()`` (a kernel's native library) when native kernels are on
    (``CompileOptions.native``); None otherwise, with a note ``"<what>: no native kernel
    (<why>)"`` when gcc is missing, the build or the load failed: the kernel then takes its
    NumPy path."""
    if not ctx.native:
        return None
    try:
        return load()
    except (CompileError, OSError) as e:
        ctx.notes.append(f"{what}: no native kernel ({str(e).splitlines()[0]})")
        return None
