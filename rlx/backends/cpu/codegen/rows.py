"""C renderer for row-wise kernels. In: a :class:`RowKind` (softmax, log-softmax, layer
norm, RMS norm, matmul epilogue), the dtype's :class:`~rlx.backends.cpu.codegen.elementwise.CType`
and the variant flags (residual input, beta, activation). Out: a
:class:`~rlx.backends.cpu.codegen.elementwise.CFunction` for one translation unit of
:class:`~rlx.backends.cpu.codegen.elementwise.CModule` (same prelude, libmvec declarations and
loader as the elementwise regions: ``engines.region.load_function`` / ``bind``).

Every function has the signature ``void name(const long* m, P0* p0, ..., const double*
c, long nthreads)``: ``m = [rows, n]`` (a C-contiguous ``[rows, n]`` view of every
row operand; per-column operands gamma/beta/bias have ``n`` elements), ``c`` the
run-time constants (``eps``, the attention ``scale``). Extents, eps and scale are
arguments, so one library serves every shape, eps and scale. The function is named
``<RowSpec.name>_<hex>`` after its text (``codegen.content_symbol``), so a library holding
other code lacks the symbol. Rows are shared by an OpenMP team when ``nthreads > 1``,
claimed in chunks (``codegen.loop.team_loop``).

Each row is walked two or three times (a row of a transformer, 1.5-6 KB, stays in L1
between the walks) with ``#pragma omp simd`` loops; reductions accumulate in the
register type (f32 for f32/f16/bf16) over SIMD lanes. Rows go in blocks of
:data:`ROW_BLOCK`: each walk runs over the block's rows before the next walk starts, so
one row's dependent chain (reduce, divide, reduce, sqrt) overlaps the others' (layer
norm [128,384]: 18 us per call row by row, 11 us in blocks of 4, on this machine).

The arithmetic follows the references op for op: ``exp(x - max) / sum``,
``(x - max) - log(sum)``, ``c / sqrt(mean(c*c) + eps) * gamma (+ beta)``,
``act(y + bias)``, ``act(gate) * up`` with the activation rendered by
:data:`~rlx.backends.cpu.codegen.elementwise.UNARY_C` (the prelude's sigmoid / silu / softplus
helpers are branch-free, so these loops vectorise; softmax's exp is the prelude's
``rlx_expneg``); f16/bf16 load into f32 and round once on store (``x + residual`` is
rounded through the dtype first, as the fused reference stores it). Output pointers are not ``restrict``:
each loop reads an index before writing it, so an output may alias its row input.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from rlx.backends.cpu.codegen.elementwise import (
    C_TYPES,
    NAME_PLACEHOLDER,
    UNARY_C,
    CFunction,
    CType,
    content_symbol,
    math_calls,
)
from rlx.backends.cpu.codegen.loop import team_loop
from rlx.dtype import DType
from rlx.ops.elementwise import UnaryKind

__all__ = ["RowKind", "RowSpec", "render_rows", "ACT_CALLS"]


class RowKind(enum.Enum):
    """What a row function computes."""

    SOFTMAX = "softmax"
    LOG_SOFTMAX = "log_softmax"
    LAYER_NORM = "layer_norm"
    RMS_NORM = "rms_norm"
    BIAS_ACT = "bias_act"  # y = act(y + bias) in place (matmul epilogue)
    GATE_MUL = "gate_mul"  # out = act(x) * out (SwiGLU epilogue: x the gate, out the up)


# activations calling a math-library function per element (the OpenMP work estimate)
ACT_CALLS = frozenset(
    k for k, render in UNARY_C.items() if math_calls(render(["a"], C_TYPES[DType.F32]))
)


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One row function: ``kind`` over values of C type ``ctype``; ``residual``: the
    norm input is ``x + residual``; ``beta``: the norm adds beta / the epilogue adds a
    bias; ``act``: the epilogue's activation (None: bias only); softmax only:
    ``scaled`` multiplies each input by ``c[1]`` first (attention scores), ``safe`` makes
    a row of -inf give zeros (a query that sees no key) instead of NaN."""

    kind: RowKind
    ctype: CType
    residual: bool = False
    beta: bool = False
    act: UnaryKind | None = None
    scaled: bool = False
    safe: bool = False

    @property
    def name(self) -> str:
        """The readable prefix of the function's symbol (``rlx_rows_softmax_float``...)."""
        parts = ["rlx_rows", self.kind.value, self.ctype.storage.strip("_").lower()]
        if self.residual:
            parts.append("res")
        if self.beta:
            parts.append("beta")
        if self.act is not None:
            parts.append(self.act.value)
        if self.scaled:
            parts.append("scaled")
        if self.safe:
            parts.append("safe")
        return "_".join(parts)

    @property
    def calls_per_element(self) -> int:
        """Math-library calls per element (softmax: exp; epilogue: its activation)."""
        if self.kind in (RowKind.SOFTMAX, RowKind.LOG_SOFTMAX):
            return 1
        return int(self.act in ACT_CALLS)


def _suffix(t: CType) -> str:
    return "f" if t.value == "float" else ""


def _operands(spec: RowSpec) -> list[tuple[str, str]]:
    """(C declaration, name) of each pointer operand after ``m``, in order."""
    s = spec.ctype.storage
    if spec.kind is RowKind.BIAS_ACT:
        ops = [(f"{s}*", "y")]
        if spec.beta:
            ops.append((f"const {s}*", "bias"))
        return ops
    ops = [(f"const {s}*", "x")]
    if spec.residual:
        ops.append((f"const {s}*", "res"))
    if spec.kind in (RowKind.LAYER_NORM, RowKind.RMS_NORM):
        ops.append((f"const {s}*", "gamma"))
        if spec.beta:
            ops.append((f"const {s}*", "beta"))
    ops.append((f"{s}*", "out"))
    return ops


# A reduction loop asks for 64 lanes: gcc then keeps several vector accumulators (four
# AVX-512 registers of f32), so the adds of one row do not wait on each other's latency.
REDUCTION_LANES = 64


def _simd(reduction: str | None = None) -> str:
    if reduction is None:
        return "#pragma omp simd"
    return f"#pragma omp simd reduction({reduction}) simdlen({REDUCTION_LANES})"


ROW_BLOCK = 4  # rows whose passes are interleaved (their reductions overlap in the core)


def _phases(spec: RowSpec) -> tuple[list[str], list[list[str]]]:
    """The per-row-block statement arrays and the phases: each phase's statements run
    for row ``k`` of a block (pointers ``*r`` at the row's start) before the next phase
    starts, so the dependent chains of the block's rows (reduce, divide, reduce, sqrt)
    overlap. A phase passes per-row scalars to later ones through ``a_*[k]``."""
    t = spec.ctype
    v = t.value
    ld = t.load.format

    def st(e: str) -> str:
        return t.store.format(f"({e})")

    f = t.fn
    sfx = _suffix(t)
    n = f"({v})n"
    if spec.kind is RowKind.BIAS_ACT:
        y = f"{ld('yr[j]')}" + (f" + {ld('bias[j]')}" if spec.beta else "")
        if t.round is not None and spec.beta:
            y = t.round.format(y)
        act = f"({v})({UNARY_C[spec.act](['a'], t)})" if spec.act is not None else "a"
        return [], [[_simd(), "for (long j = 0; j < n; ++j) {", f"    const {v} a = {y};",
                     f"    yr[j] = {st(act)};", "}"]]  # fmt: skip
    if spec.kind is RowKind.GATE_MUL:
        act = f"({v})({UNARY_C[spec.act](['a'], t)})" if spec.act is not None else "a"
        prod = st(f"{act} * {ld('outr[j]')}")
        return [], [[_simd(), "for (long j = 0; j < n; ++j) {", f"    const {v} a = {ld('xr[j]')};",
                     f"    outr[j] = {prod};", "}"]]  # fmt: skip
    if spec.kind in (RowKind.SOFTMAX, RowKind.LOG_SOFTMAX):
        x = ld("xr[j]")
        if spec.scaled:  # the attention scores' scale, rounded like NumPy's multiply
            x = f"({v})({x} * sc)"
        p1 = [
            f"{v} mx = -INFINITY;",
            _simd("max:mx"),
            f"for (long j = 0; j < n; ++j) {{ const {v} a = {x}; mx = a > mx ? a : mx; }}",
        ]
        if spec.safe:  # a row that sees no key (all -inf) gives zeros
            p1.append("if (mx == -INFINITY) mx = 0;")
        p1.append("a_mx[k] = mx;")
        # f32/f64 softmax keeps exp(x - max) in the output row; f16/bf16 recompute it
        keep = spec.kind is RowKind.SOFTMAX and t.round is None
        p2 = [f"const {v} mx = a_mx[k];", f"{v} s = 0;", _simd("+:s"),
              "for (long j = 0; j < n; ++j) {", f"    const {v} e = rlx_expneg{sfx}({x} - mx);"]  # fmt: skip
        if keep:
            p2.append("    outr[j] = e;")
        p2 += ["    s += e;", "}"]
        if spec.safe:
            p2.append("if (s == 0) s = 1;")
        p3 = [f"const {v} mx = a_mx[k];"]
        if spec.kind is RowKind.LOG_SOFTMAX:
            p2.append(f"a_s[k] = {f('log')}(s);")
            p3.append(f"const {v} ls = a_s[k];")
            y = f"({x} - mx) - ls"
        else:
            p2.append("a_s[k] = s;")
            p3.append(f"const {v} s = a_s[k];")
            y = "outr[j] / s" if keep else f"rlx_expneg{sfx}({x} - mx) / s"
        p3 += [_simd(), "for (long j = 0; j < n; ++j) {", f"    outr[j] = {st(y)};", "}"]
        pre = [f"const {v} sc = ({v})c[1];"] if spec.scaled else []
        return pre, [p1, p2, p3]
    # norms: h = x (+ residual, rounded through the dtype)
    h = ld("xr[j]")
    if spec.residual:
        h = f"{ld('xr[j]')} + {ld('rr[j]')}"
        if t.round is not None:
            h = t.round.format(h)
    phases: list[list[str]] = []
    if spec.kind is RowKind.LAYER_NORM:
        phases.append([f"{v} sum = 0;", _simd("+:sum"),
                       f"for (long j = 0; j < n; ++j) {{ sum += {h}; }}",
                       f"a_mean[k] = sum / {n};"])  # fmt: skip
        cexpr, mean = f"(({h}) - mean)", [f"const {v} mean = a_mean[k];"]
    else:
        cexpr, mean = f"({h})", []
    phases.append(mean + [f"{v} sq = 0;", _simd("+:sq"),
                  f"for (long j = 0; j < n; ++j) {{ const {v} d = {cexpr}; sq += d * d; }}",
                  f"a_sd[k] = {f('sqrt')}(sq / {n} + ({v})c[0]);"])  # fmt: skip
    y = f"d / sd * {ld('gamma[j]')}"
    if spec.beta:
        y = f"{y} + {ld('beta[j]')}"
    phases.append(mean + [f"const {v} sd = a_sd[k];", _simd(),
                  "for (long j = 0; j < n; ++j) {",
                  f"    const {v} d = {cexpr};", f"    outr[j] = {st(y)};", "}"])  # fmt: skip
    return [], phases


def render_rows(spec: RowSpec) -> CFunction:
    """The C function of ``spec`` (see the module docstring for its arguments)."""
    if spec.act is not None and spec.act not in UNARY_C:
        raise ValueError(f"activation {spec.act} has no C rendering")
    name = NAME_PLACEHOLDER
    ops = _operands(spec)
    params = ["const long* restrict m"] + [f"{d} p{k}" for k, (d, _) in enumerate(ops)]
    params.append("const double* restrict c")
    row_ptrs = {"x": "xr", "res": "rr", "out": "outr", "y": "yr"}
    lines = [f"static void {name}_rows(long r0, long r1, {', '.join(params)}) {{"]
    lines.append("    const long n = m[1];")
    for k, (d, nm) in enumerate(ops):
        if nm not in row_ptrs:
            lines.append(f"    {d} {nm} = p{k};")
    lines.append("    (void)c;")
    pre, phases = _phases(spec)
    lines += ["    " + s for s in pre]
    text = "\n".join(x for p in phases for x in p)
    arrays = [a for a in ("a_mx", "a_s", "a_mean", "a_sd") if f"{a}[k]" in text]
    lines.append(f"    for (long r = r0; r < r1; r += {ROW_BLOCK}) {{")
    lines.append(f"        const long kb = r1 - r < {ROW_BLOCK} ? r1 - r : {ROW_BLOCK};")
    if arrays:
        lines.append(
            f"        {spec.ctype.value} {', '.join(f'{a}[{ROW_BLOCK}]' for a in arrays)};"
        )
    for phase in phases:
        lines.append("        for (long k = 0; k < kb; ++k) {")
        for k, (d, nm) in enumerate(ops):
            if nm in row_ptrs:
                lines.append(f"            {d} {row_ptrs[nm]} = p{k} + (r + k) * n;")
        lines += ["            " + s for s in phase]
        lines.append("        }")
    lines += ["    }", "}", ""]
    args = ", ".join(["m"] + [f"p{k}" for k in range(len(ops))] + ["c"])
    lines.append(f"void {name}({', '.join(params)}, long nthreads) {{")
    lines.append("    const long rows = m[0];")
    lines.append("#ifdef _OPENMP")
    lines += team_loop(f"{name}_rows", args)
    lines.append("#endif")
    lines.append("    (void)nthreads;")
    lines.append(f"    {name}_rows(0, rows, {args});")
    lines.append("}")
    ops_count = {RowKind.SOFTMAX: 4, RowKind.LOG_SOFTMAX: 5, RowKind.LAYER_NORM: 7}
    text = "\n".join(lines) + "\n"
    symbol = content_symbol(spec.name, text)
    return CFunction(
        symbol,
        text.replace(NAME_PLACEHOLDER, symbol),
        num_pointers=len(ops) + 2,
        ops=ops_count.get(spec.kind, 5),
        calls=spec.calls_per_element,
    )
