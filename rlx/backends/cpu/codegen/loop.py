"""Loop nests for generated elementwise C code. In: the output dims and, per pointer
operand, its C type and element strides along them. Out: the text of a C function
``void name(const long* m, T0* p0, ..., long nthreads)`` whose per-element statements
come from a callback (see :func:`rlx.backends.cpu.codegen.elementwise.render_region`), and the
extents and strides ``m`` it reads: the text depends only on the collapsed pattern
(how many dims, which operands are broadcast along the innermost one), so a new
symbolic-shape binding of the same region reuses the built library. The body's own
run-time values (its constants, see ``codegen``) follow in ``m``; the body reads them
as ``c[0]``, ``c[1]``... (``c`` points just past the loop's values).

The nest collapses the output dims the operands traverse alike, so a same-shape region
is one flat ``#pragma omp simd`` loop and a bias over rows is a row loop around a
contiguous inner loop. Long inner loops are split into blocks of :data:`ROW_BLOCK`;
an OpenMP team shares the (row, block) pairs when the function is called with
``nthreads > 1`` (claimed in chunks, :func:`team_loop`), else one thread runs them with
no OpenMP call at all.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from rlx.backends.cpu.codegen.elementwise import CType

__all__ = [
    "CodegenUnsupported",
    "LoopBody",
    "STAGE_BLOCK",
    "Operand",
    "operand_strides",
    "collapse",
    "render_loop",
    "Loop",
    "ROW_BLOCK",
    "TEAM_CHUNKS",
    "team_loop",
]


class CodegenUnsupported(Exception):
    """The body has something the C tables cannot render (the message says what)."""


@dataclass(frozen=True, slots=True)
class Operand:
    """One pointer argument of a generated function: its C type and its element stride
    along each output dim (0 where it is broadcast)."""

    ctype: CType
    strides: tuple[int, ...]
    output: bool = False


def operand_strides(a: np.ndarray, out_dims: Sequence[int]) -> tuple[int, ...]:
    """Element strides of array ``a`` along ``out_dims`` under NumPy broadcasting."""
    nd = len(out_dims)
    if a.ndim > nd:
        raise CodegenUnsupported(f"operand of rank {a.ndim} in a rank-{nd} loop")
    pad = nd - a.ndim
    strides = [0] * nd
    for i, (d, s) in enumerate(zip(a.shape, a.strides, strict=True)):
        if s % a.itemsize:
            raise CodegenUnsupported(f"operand stride {s} is not a multiple of {a.itemsize}")
        if d != 1:
            if d != out_dims[pad + i]:
                raise CodegenUnsupported(f"operand dims {a.shape} do not broadcast to {out_dims}")
            strides[pad + i] = s // a.itemsize
    return tuple(strides)


def collapse(
    dims: Sequence[int], strides: Sequence[tuple[int, ...]]
) -> tuple[tuple[int, ...], list[tuple[int, ...]]]:
    """Drop size-1 dims and merge neighbours every operand walks as one (contiguous or
    broadcast in both); returns the fewer dims and each operand's strides over them."""
    keep = [i for i, d in enumerate(dims) if d != 1]
    ds = [dims[i] for i in keep] or [1]
    ss = [[s[i] for i in keep] or [0] for s in strides]
    i = len(ds) - 2
    while i >= 0:
        if all(s[i] == s[i + 1] * ds[i + 1] for s in ss):
            ds[i : i + 2] = [ds[i] * ds[i + 1]]
            for s in ss:
                s[i : i + 2] = [s[i + 1]]
        i -= 1
    return tuple(ds), [tuple(s) for s in ss]


@dataclass(frozen=True, slots=True)
class LoopBody:
    """Per-element C code: ``hoisted`` runs once per row (loop-invariant loads and
    constants), ``stages`` are the statement lists of consecutive inner loops and
    ``temps`` declare the block arrays carrying values from one stage to a later one."""

    hoisted: list[str]
    stages: list[list[str]]
    temps: list[str]


STAGE_BLOCK = 512  # elements per block of a staged body (its temporaries stay in L1)
ROW_BLOCK = 4096  # inner-loop elements per scheduling block (an OpenMP team shares blocks)


@dataclass(frozen=True, slots=True)
class Loop:
    """A rendered loop nest: ``source`` (independent of the extents and strides, so one
    library serves every shape with the same collapsed pattern) and ``meta``, the int64
    array of extents and strides the function reads through its first argument (the
    body's values ``c[k]`` go after them: ``np.concatenate([meta, values])``)."""

    source: str
    meta: np.ndarray


def _meta(cdims: tuple[int, ...], cstrides: list[tuple[int, ...]]) -> np.ndarray:
    """[inner, nblocks, blk, rows, outer dims..., outer strides (axis-major)...,
    inner strides...]."""
    inner = cdims[-1]
    nblocks = -(-inner // ROW_BLOCK) if inner > ROW_BLOCK else 1
    blk = -(-inner // nblocks)
    rows = math.prod(cdims[:-1]) * nblocks
    outer_strides = [s[ax] for ax in range(len(cdims) - 1) for s in cstrides]
    vals = [inner, nblocks, blk, rows, *cdims[:-1], *outer_strides, *(s[-1] for s in cstrides)]
    return np.array(vals, dtype=np.int64)


#: chunks per thread of a team (claimed one at a time, see :func:`team_loop`)
TEAM_CHUNKS = 8


def team_loop(rows_fn: str, args: str) -> list[str]:
    """C lines (inside ``#ifdef _OPENMP``, with ``rows`` and ``nthreads`` in scope) that
    run ``rows_fn(r0, r1, args)`` over ``[0, rows)`` on a team of ``nthreads`` and return.
    The rows are cut into up to :data:`TEAM_CHUNKS` chunks per thread that the team claims
    one at a time (``schedule(dynamic)``): when a worker starts late (another job holds
    its core) the others take its chunks instead of waiting for it to do a fixed share.
    Each row is computed by one thread whatever the split, so results do not depend on
    the thread count."""
    return [
        "    if (nthreads > 1 && rows > 1) {",
        f"        const long chunks = rows < {TEAM_CHUNKS} * nthreads ? rows : "
        f"{TEAM_CHUNKS} * nthreads;",
        "        #pragma omp parallel for num_threads(nthreads) schedule(dynamic, 1)",
        "        for (long q = 0; q < chunks; ++q)",
        f"            {rows_fn}(rows * q / chunks, rows * (q + 1) / chunks, {args});",
        "        return;",
        "    }",
    ]


def render_loop(
    name: str,
    operands: Sequence[Operand],
    dims: Sequence[int],
    body: Callable[[list[str]], LoopBody],
    *,
    restrict: bool = True,
) -> Loop:
    """A C function ``void name(const long* m, T0* p0, ..., long nthreads)`` looping over
    ``dims`` (extents and strides read from ``m``, see :class:`Loop`; the body reads
    values the caller appends to ``meta`` as ``c[k]``).

    ``body(index_exprs)`` gets one element index expression per operand (operands whose
    inner stride is 0 get one without ``j``) and returns a :class:`LoopBody`. One stage
    is one ``#pragma omp simd`` loop over the row; several stages run in turn over
    blocks of :data:`STAGE_BLOCK` elements, passing values through the body's block
    temporaries (indexed ``[j - jb]``). ``restrict`` marks every pointer as not aliasing
    (pass False when the output is one of the inputs)."""
    cdims, cstrides = collapse(dims, [o.strides for o in operands])
    nk, nouter = len(operands), len(cdims) - 1
    q = " restrict" if restrict else ""
    params = ["const long* restrict m"] + [
        f"{'' if o.output else 'const '}{o.ctype.storage}*{q} p{k}" for k, o in enumerate(operands)
    ]
    idx = []
    for k, s in enumerate(cstrides):
        idx.append(f"b{k}" if s[-1] == 0 else f"b{k} + j" if s[-1] == 1 else f"b{k} + j * s{k}")
    lb = body(idx)
    sdecl = [
        f"const long s{k} = m[{4 + nouter + nouter * nk + k}];"
        for k, s in enumerate(cstrides)
        if s[-1] not in (0, 1)
    ]
    lines = [f"static void {name}_rows(long r0, long r1, {', '.join(params)}) {{"]
    lines.append("    const long inner = m[0], nblocks = m[1], blk = m[2];")
    lines.append(f"    const long* const c = m + {4 + nouter + nouter * nk + nk};")
    lines.append("    (void)c;")
    lines += ["    " + d for d in sdecl]
    lines.append("    for (long r = r0; r < r1; ++r) {")
    lines.append("        long q = r;")
    lines.append("        const long j0 = (q % nblocks) * blk; q /= nblocks;")
    lines.append("        const long j1 = j0 + blk < inner ? j0 + blk : inner;")
    lines.append("        " + " ".join(f"long b{k} = 0;" for k in range(nk)))
    for ax in range(nouter - 1, -1, -1):
        lines.append(f"        {{ const long i = q % m[{4 + ax}]; q /= m[{4 + ax}];")
        adds = [f"b{k} += i * m[{4 + nouter + ax * nk + k}];" for k in range(nk)]
        lines.append("          " + " ".join(adds) + " }")
    lines += ["        " + h for h in lb.hoisted]
    if len(lb.stages) == 1:
        lines.append("        #pragma omp simd")
        lines.append("        for (long j = j0; j < j1; ++j) {")
        lines += ["            " + s for s in lb.stages[0]]
        lines.append("        }")
    else:
        lines += ["        " + t for t in lb.temps]
        lines.append(f"        for (long jb = j0; jb < j1; jb += {STAGE_BLOCK}L) {{")
        lines.append(
            f"            const long je = jb + {STAGE_BLOCK}L < j1 ? jb + {STAGE_BLOCK}L : j1;"
        )
        for stage in lb.stages:
            lines.append("            #pragma omp simd")
            lines.append("            for (long j = jb; j < je; ++j) {")
            lines += ["                " + s for s in stage]
            lines.append("            }")
        lines.append("        }")
    lines += ["    }", "}", ""]
    args = ", ".join(["m"] + [f"p{k}" for k in range(nk)])
    lines.append(f"void {name}({', '.join(params)}, long nthreads) {{")
    lines.append("    const long rows = m[3];")
    lines.append("#ifdef _OPENMP")
    lines += team_loop(f"{name}_rows", args)
    lines.append("#endif")
    lines.append(f"    {name}_rows(0, rows, {args});")
    lines.append("}")
    return Loop("\n".join(lines) + "\n", _meta(cdims, cstrides))
