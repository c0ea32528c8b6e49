"""C renderer for elementwise code. In: an elementwise body Graph (Inputs ``in0..inN``,
Constants, Unary/Binary/Compare/Where/Cast nodes, one output) and the element layouts of
its operands. Out: C source text of one function computing the whole body per output
element in registers (:class:`CFunction`), grouped into a translation unit by
:class:`CModule` and built by :mod:`rlx.backends.cpu.native`.

Three tables, keyed like tinygrad's ``code_for_op``, say what C an op is:

* :data:`C_TYPES`: how a :class:`~rlx.dtype.DType` is stored and held in a register
  (f16/bf16 are held as ``float`` and rounded through their type after every node, as
  the reference rounds every node's result to its dtype);
* :data:`UNARY_C`, :data:`BINARY_C`, :data:`COMPARE_C`: one renderer per kind,
  ``(args, CType) -> C expression`` (a unary kind's is the ``c`` of its row in
  ``rlx/ops/unary_kinds.py``); ``Where`` and ``Cast`` are rendered by
  :func:`render_node`.

Math functions are libm's (``expf``, ``tanhf``, ``erf`` in f64 for gelu/erf as the
reference computes it...). With ``CModule(vector_math=True)`` they are declared with
glibc libmvec's SIMD variants, so gcc vectorises loops that call them. A body with two
or more calls on one dependency path is split into stages (:func:`_stages`) that run in
turn over blocks of ``STAGE_BLOCK`` elements: each call then runs over a whole block
(throughput-bound) instead of a chain of dependent calls per element (latency-bound).
The ``rlx_*`` helpers the expressions call are the prelude's
(:mod:`rlx.backends.cpu.codegen.prelude`, re-exported here).

The text depends on the body's structure only, so regions that differ in their values
share one library: a scalar Constant is read from an int64 slot of the function's first
argument (bound at schedule-build time, loaded once per row into a register), except the
few whose value gcc compiles into the code (:func:`value_shapes_code`: ``pow(x, 2)``,
integer division by a constant), which stay C literals. Each function is named after its
text (:func:`content_symbol`: ``rlx_region_<hex>``), so a library holding other code
lacks the symbol and fails to load.

The loop nest around the per-element code is :mod:`rlx.backends.cpu.codegen.loop`.
Everything that is not in the tables raises :class:`CodegenUnsupported` with the reason;
callers then use their NumPy kernel. Semantics follow the reference ops exactly where C
allows: NaN-propagating max/min, truncating integer division (x / 0 = 0), C ``fmod``,
``rint`` (half to even), wrapping signed integer arithmetic (through unsigned types).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from rlx.backends.cpu.codegen.loop import (
    STAGE_BLOCK,
    CodegenUnsupported,
    LoopBody,
    Operand,
    operand_strides,
    render_loop,
)
from rlx.backends.cpu.codegen.prelude import PRELUDE, VECTOR_MATH, vector_math_decls
from rlx.dtype import DType
from rlx.ir.mir import Graph, Node
from rlx.ops.core import Constant, Input
from rlx.ops.elementwise import (
    Binary,
    BinaryKind,
    Cast,
    Compare,
    CompareKind,
    Unary,
    UnaryKind,
    Where,
)
from rlx.ops.unary_kinds import UNARY

__all__ = [
    "CType",
    "C_TYPES",
    "UNARY_C",
    "BINARY_C",
    "COMPARE_C",
    "CodegenUnsupported",
    "CFunction",
    "CModule",
    "PRELUDE",
    "VECTOR_MATH",
    "vector_math_decls",
    "render_node",
    "render_constant",
    "constant_slot",
    "load_constant",
    "value_shapes_code",
    "NAME_PLACEHOLDER",
    "content_symbol",
    "render_region",
    "math_calls",
]


@dataclass(frozen=True, slots=True)
class CType:
    """How a dtype lives in C: ``storage`` is the pointer element type, ``value`` the
    register type, ``load``/``store`` convert between them (``{}`` is the operand) and
    ``round`` (f16/bf16 only) rounds a register value through the dtype."""

    storage: str
    value: str
    load: str = "{}"
    store: str = "{}"
    round: str | None = None
    signed_int: bool = False
    unsigned: str = ""  # the unsigned twin of a signed integer type (wrapping arithmetic)

    @property
    def is_float(self) -> bool:
        return self.value in ("float", "double")

    @property
    def is_int(self) -> bool:
        return not self.is_float and self.value != "bool"

    def fn(self, name: str) -> str:
        """The libm function ``name`` for this register type (``expf`` / ``exp``)."""
        return name + "f" if self.value == "float" else name


def _int(t: str, u: str) -> CType:
    return CType(t, t, signed_int=True, unsigned=u)


C_TYPES: dict[DType, CType] = {
    DType.F32: CType("float", "float"),
    DType.F64: CType("double", "double"),
    DType.F16: CType("_Float16", "float", "(float){}", "(_Float16){}", "(float)(_Float16)({})"),
    DType.BF16: CType(
        "uint16_t", "float", "rlx_bf16_to_f32({})", "rlx_f32_to_bf16({})", "rlx_round_bf16({})"
    ),
    # narrow signed types wrap through uint32_t: uint8/16 operands would promote to int
    DType.I8: _int("int8_t", "uint32_t"),
    DType.I16: _int("int16_t", "uint32_t"),
    DType.I32: _int("int32_t", "uint32_t"),
    DType.I64: _int("int64_t", "uint64_t"),
    DType.U8: CType("uint8_t", "uint8_t"),
    DType.U32: CType("uint32_t", "uint32_t"),
    DType.BOOL: CType("uint8_t", "bool", "({} != 0)", "(uint8_t){}"),
}

Render = Callable[[Sequence[str], CType], str]


def _wrap(op: str) -> Render:
    """``a op b``; signed integers go through their unsigned twin (wraps like NumPy, no
    undefined overflow)."""

    def r(a: Sequence[str], t: CType) -> str:
        if t.signed_int:
            return f"({t.value})(({t.unsigned}){a[0]} {op} ({t.unsigned}){a[1]})"
        return f"({a[0]} {op} {a[1]})"

    return r


def _lit(v: float, t: CType) -> str:
    return f"(({t.value}){float(v).hex()})"


def _unary_render(kind: UnaryKind) -> Render | None:
    """The renderer of a kind's C expression (the ``c`` of its row in
    ``rlx/ops/unary_kinds.py``: a template or a function); None when it has none."""
    c = UNARY[kind].c
    if c is None or callable(c):
        return c

    def render(a: Sequence[str], t: CType) -> str:
        return c.format(x=a[0], t=t.value, f="f" if t.value == "float" else "")

    return render


UNARY_C: dict[UnaryKind, Render] = {k: r for k in UnaryKind if (r := _unary_render(k)) is not None}


def _div(a: Sequence[str], t: CType) -> str:
    x, y = a
    if t.is_float:
        return f"({x} / {y})"
    if t.signed_int:  # truncating; x / 0 is 0; MIN / -1 wraps
        neg = UNARY_C[UnaryKind.NEG]([x], t)
        return f"({y} == 0 ? ({t.value})0 : ({y} == -1 ? {neg} : {x} / {y}))"
    return f"({y} == 0 ? ({t.value})0 : {x} / {y})"


def _mod(a: Sequence[str], t: CType) -> str:
    x, y = a
    if t.is_float:
        return f"{t.fn('fmod')}({x}, {y})"
    bad = f"{y} == 0 || {y} == -1" if t.signed_int else f"{y} == 0"
    return f"({bad} ? ({t.value})0 : {x} % {y})"


def _pow(a: Sequence[str], t: CType) -> str:
    x, y = a
    if t.is_float:
        return f"{t.fn('pow')}({x}, {y})"
    if t.signed_int:
        return f"({t.value})rlx_ipow((int64_t){x}, (int64_t){y})"
    return f"({t.value})rlx_upow((uint64_t){x}, (uint64_t){y})"


def _maxmin(cmp: str) -> Render:
    """NumPy's maximum/minimum: a NaN in either operand is the result."""

    def r(a: Sequence[str], t: CType) -> str:
        x, y = a
        if t.is_float:
            return f"(({x} {cmp} {y} || {x} != {x}) ? {x} : {y})"
        return f"({x} {cmp} {y} ? {x} : {y})"

    return r


BINARY_C: dict[BinaryKind, Render] = {
    BinaryKind.ADD: _wrap("+"),
    BinaryKind.SUB: _wrap("-"),
    BinaryKind.MUL: _wrap("*"),
    BinaryKind.DIV: _div,
    BinaryKind.MAX: _maxmin(">"),
    BinaryKind.MIN: _maxmin("<"),
    BinaryKind.POW: _pow,
    BinaryKind.MOD: _mod,
    BinaryKind.AND: lambda a, t: f"({a[0]} && {a[1]})",
    BinaryKind.OR: lambda a, t: f"({a[0]} || {a[1]})",
}

_CMP = {
    CompareKind.EQ: "==",
    CompareKind.NE: "!=",
    CompareKind.LT: "<",
    CompareKind.LE: "<=",
    CompareKind.GT: ">",
    CompareKind.GE: ">=",
}


def _compare(op: str) -> Render:
    return lambda a, t: f"({a[0]} {op} {a[1]})"


COMPARE_C: dict[CompareKind, Render] = {k: _compare(op) for k, op in _CMP.items()}


class NodeLabel:
    """``%id op`` of a node, formatted only when shown (an error message): building a
    schedule renders regions for every shape, and formatting an op's attributes (its
    constants' arrays) each time cost more than the rendering."""

    __slots__ = ("node",)

    def __init__(self, node: Node):
        self.node = node

    def __str__(self) -> str:
        return f"%{self.node.id} {self.node.op}"


def ctype(dt: DType, what: object) -> CType:
    """The C type of ``dt``; CodegenUnsupported naming ``what`` (its ``str``) when there
    is none."""
    t = C_TYPES.get(dt)
    if t is None:
        raise CodegenUnsupported(f"{what} has dtype {dt}, which has no C rendering")
    return t


def render_node(node: Node, args: Sequence[str], in_dtypes: Sequence[DType]) -> str:
    """The C expression of one elementwise node over register values ``args`` (already
    rounded to their dtypes), in the register type of ``node.dtype`` (rounded)."""
    op = node.op
    what = NodeLabel(node)
    out_t = ctype(node.dtype, what)
    in_t = [ctype(d, what) for d in in_dtypes]
    table: dict | None = None
    if isinstance(op, Unary):
        table = UNARY_C
    elif isinstance(op, Binary):
        table = BINARY_C
    elif isinstance(op, Compare):
        table = COMPARE_C
    if table is not None:
        render = table.get(op.fn)  # type: ignore[attr-defined]
        if render is None:
            raise CodegenUnsupported(f"{what} has no C rendering")
        expr = render(args, in_t[0])
    elif isinstance(op, Where):
        expr = f"({args[0]} ? {args[1]} : {args[2]})"
    elif isinstance(op, Cast):
        if op.to is DType.BOOL:
            expr = f"({args[0]} != 0)"
        elif op.to is DType.BF16 and in_dtypes[0] is DType.F64:  # once, not through f32
            return f"rlx_bf16_to_f32(rlx_f64_to_bf16({args[0]}))"
        elif op.to is DType.BF16 and in_dtypes[0] in (DType.I32, DType.I64, DType.U32):
            helper = (
                "rlx_i64_to_bf16((int64_t)" if in_t[0].signed_int else "rlx_u64_to_bf16((uint64_t)"
            )
            return f"rlx_bf16_to_f32({helper}{args[0]}))"  # once, as above
        elif out_t.round is not None:  # one rounding from the source type (f64 -> f16)
            return out_t.round.format(args[0])
        else:
            expr = f"({out_t.value}){args[0]}"
    else:
        raise CodegenUnsupported(f"{what} has no C rendering")
    if out_t.round is not None:
        expr = out_t.round.format(expr)
    return expr


def _scalar(node: Node) -> np.generic:
    return np.asarray(node.op.value.array()).reshape(-1)[0]  # type: ignore[attr-defined, no-any-return]


def render_constant(node: Node) -> str:
    """A one-element Constant as a C literal of its register type."""
    t = ctype(node.dtype, f"%{node.id} constant")
    v = _scalar(node)
    if t.value == "bool":
        return "true" if bool(v) else "false"
    if t.is_float:
        f = float(v)
        if math.isnan(f):
            return f"(({t.value})NAN)"
        if math.isinf(f):
            return f"(({t.value})({'-' if f < 0 else ''}INFINITY))"
        return _lit(f, t)
    i = int(v)
    if t.value == "int64_t" and i == -(2**63):
        return "INT64_MIN"
    return f"(({t.value}){i}LL)" if i < 0 else f"(({t.value}){i}ULL)"


def constant_slot(node: Node) -> int:
    """A one-element Constant as the int64 slot its function reads (``c[k]``, see
    :func:`render_region`): an integer or bool as itself, a float as the bits of its f64
    value (exact for every float dtype)."""
    t = ctype(node.dtype, f"%{node.id} constant")
    v = _scalar(node)
    if t.is_float:
        return int(np.float64(float(v)).view(np.int64))
    return int(bool(v)) if t.value == "bool" else int(v)


def load_constant(t: CType, k: int) -> str:
    """The C expression reading slot ``k`` of ``c`` (see :func:`constant_slot`) as ``t``."""
    if t.is_float:
        return f"({t.value})rlx_f64(c[{k}])"
    return f"(c[{k}] != 0)" if t.value == "bool" else f"({t.value})c[{k}]"


def value_shapes_code(user: Node, pos: int, const: Node) -> bool:
    """Whether gcc compiles ``user`` differently for the value of its scalar constant
    operand ``pos``: a float Pow's exponent 2 or -1 (``x * x`` / ``1 / x`` instead of a
    ``pow`` call) and an integer Div/Mod's divisor (a multiply-high instead of a scalar
    division per element, which x86 has no SIMD instruction for). Such a constant is a
    C literal; every other one is a run-time argument."""
    op = user.op
    if not isinstance(op, Binary) or pos != 1:
        return False
    t = ctype(const.dtype, f"%{const.id} constant")
    if op.fn is BinaryKind.POW and t.is_float:
        return float(_scalar(const)) in (2.0, -1.0)
    return op.fn in (BinaryKind.DIV, BinaryKind.MOD) and t.is_int


NAME_PLACEHOLDER = "rlx_fn_NAME"


def content_symbol(prefix: str, text: str) -> str:
    """``prefix_`` + 16 hex digits of sha256(``text``): the symbol of a generated function
    rendered as ``text`` under :data:`NAME_PLACEHOLDER`. Every library exports its own
    symbol, so a library that is not this code's (a damaged or swapped cache entry) lacks
    it and fails to load instead of running another kernel."""
    return f"{prefix}_{hashlib.sha256(text.encode()).hexdigest()[:16]}"


@dataclass(frozen=True, slots=True)
class CFunction:
    """One generated C function: its name, its text and the number of pointer arguments
    (the int64 extents and run-time values, operands, ... in the order its renderer
    documents; then one ``long nthreads``); ``ops`` counts the rendered nodes, ``calls``
    the math-library calls among them."""

    name: str
    source: str
    num_pointers: int
    ops: int
    calls: int = 0


@dataclass(frozen=True, slots=True)
class CModule:
    """A translation unit: the prelude and some functions (one gcc run builds them all).
    ``vector_math``: declare libmvec's SIMD math (the loader must make libmvec's symbols
    visible, see ``engines.region.vector_math_available``)."""

    functions: tuple[CFunction, ...]
    vector_math: bool = False

    @property
    def source(self) -> str:
        head = (
            PRELUDE.replace("#include <math.h>\n", "#include <math.h>\n" + vector_math_decls())
            if self.vector_math
            else PRELUDE
        )
        return head + "\n" + "\n".join(f.source for f in self.functions)


def _reachable(body: Graph, result: int) -> list[Node]:
    need: set[int] = set()
    stack = [result]
    while stack:
        nid = stack.pop()
        if nid not in need:
            need.add(nid)
            stack.extend(body.nodes[nid].inputs)
    return [body.nodes[i] for i in body.topo_order() if i in need]


def render_region(
    body: Graph,
    ins: Sequence[np.ndarray],
    out: np.ndarray,
    name: str | None = None,
) -> tuple[CFunction, list[np.ndarray]]:
    """Render an ElementwiseRegion body over the arrays ``ins`` (the region's inputs, in
    order) writing ``out``. Returns the function and its pointer arguments in order: the
    int64 array ``m`` (the loop's extents and strides, then one slot per scalar constant,
    :func:`constant_slot`, read as ``c[k]``), the used inputs, non-scalar constants, then
    ``out``.

    The text depends on the body's structure only: variables are numbered in emission
    order, extents and scalar constants are arguments (except the few whose value gcc
    compiles into the code, :func:`value_shapes_code`), so equal bodies over layouts of
    one pattern give equal text whatever their constants. The function is named
    ``name``, or by default :func:`content_symbol` of its text (``rlx_region_<hex>``)."""
    if len(body.outputs) != 1:
        raise CodegenUnsupported(f"the body has {len(body.outputs)} outputs, not 1")
    out_t = ctype(DType.from_numpy(out.dtype), "the region output")
    dims = tuple(out.shape)
    nodes = _reachable(body, body.outputs[0])
    arrays: list[np.ndarray] = []
    operands: list[Operand] = []
    arg_of: dict[int, int] = {}
    literal: set[int] = set()
    for n in nodes:
        for pos, i in enumerate(n.inputs):
            c = body.nodes[i]
            if isinstance(c.op, Constant) and c.op.value.array().size == 1:
                if value_shapes_code(n, pos, c):
                    literal.add(i)
        if isinstance(n.op, Input):
            a = ins[int(n.op.name[2:])]
        elif isinstance(n.op, Constant) and n.op.value.array().size > 1:
            a = np.ascontiguousarray(n.op.value.array())
        else:
            continue
        if a.dtype != n.dtype.np:
            raise CodegenUnsupported(f"%{n.id} {n.op}: array dtype {a.dtype}, node {n.dtype}")
        arg_of[n.id] = len(arrays)
        arrays.append(a)
        operands.append(Operand(ctype(n.dtype, NodeLabel(n)), operand_strides(a, dims)))
    slot_of: dict[int, int] = {}
    slots: list[int] = []
    for n in nodes:
        if isinstance(n.op, Constant) and n.id not in arg_of and n.id not in literal:
            slot_of[n.id] = len(slots)
            slots.append(constant_slot(n))
    arrays.append(out)
    operands.append(Operand(out_t, operand_strides(out, dims), output=True))
    restrict = not any(np.may_share_memory(a, out) for a in arrays[:-1])
    loop = render_loop(
        NAME_PLACEHOLDER,
        operands,
        dims,
        lambda idx: _body(nodes, body, arg_of, slot_of, operands, idx),
        restrict=restrict,
    )
    ops = sum(1 for n in nodes if not isinstance(n.op, (Input, Constant)))
    calls = len(_CALL.findall(loop.source))
    name = name or content_symbol("rlx_region", loop.source)
    source = loop.source.replace(NAME_PLACEHOLDER, name)
    meta = np.concatenate([loop.meta, np.array(slots, dtype=np.int64)])
    fn = CFunction(name, source, len(operands) + 1, ops, calls)
    return fn, [meta, *arrays]


_CALL = re.compile(r"\b(?:" + "|".join(VECTOR_MATH) + r")f?\(|rlx_sigmoid|rlx_softplus")


def math_calls(expr: str) -> int:
    """How many math-library calls (libm / libmvec functions, the prelude's sigmoid and
    softplus) C text ``expr`` makes: what the OpenMP work estimates weigh."""
    return len(_CALL.findall(expr))


MAX_TEMPS = 64  # block temporaries of a staged body (beyond: one stage)


def _stages(nodes: Sequence[Node], exprs: dict[int, str]) -> dict[int, int]:
    """Each node's stage: a stage ends with at most one math-library call on any path,
    so the calls of a long chain run over a whole block each (throughput-bound, like
    NumPy's per-op loops) instead of one latency-bound chain per element."""
    stage: dict[int, int] = {}
    called: dict[int, bool] = {}
    for n in nodes:
        ins = [(stage[i], called[i]) for i in n.inputs]
        if n.id in exprs and _CALL.search(exprs[n.id]):
            stage[n.id] = max((s + c for s, c in ins), default=0)
            called[n.id] = True
        else:
            stage[n.id] = max((s for s, _ in ins), default=0)
            called[n.id] = any(c for s, c in ins if s == stage[n.id])
    return stage


def _body(
    nodes: Sequence[Node],
    body: Graph,
    arg_of: dict[int, int],
    slot_of: dict[int, int],
    operands: Sequence[Operand],
    idx: Sequence[str],
) -> LoopBody:
    exprs: dict[int, str] = {}
    name = {n.id: f"v{k}" for k, n in enumerate(nodes)}
    for n in nodes:
        if n.id not in arg_of and not isinstance(n.op, Constant):
            args = [name[i] for i in n.inputs]
            exprs[n.id] = render_node(n, args, [body.nodes[i].dtype for i in n.inputs])
    stage = _stages(nodes, exprs)
    last = max(stage.values())
    out_id = nodes[-1].id
    crossing = {i for n in nodes for i in n.inputs if i in exprs and stage[i] < stage[n.id]} | (
        {out_id} if out_id in exprs and stage[out_id] < last else set()
    )
    if len(crossing) > MAX_TEMPS:
        stage = dict.fromkeys(stage, 0)
        last, crossing = 0, set()
    hoisted: list[str] = []
    hoisted_ids: set[int] = set()
    stages: list[list[str]] = [[] for _ in range(last + 1)]
    temps: list[str] = []
    ct = {n.id: ctype(n.dtype, NodeLabel(n)) for n in nodes}
    for n in nodes:
        t = ct[n.id]
        if isinstance(n.op, Constant) and n.id not in arg_of:
            value = load_constant(t, slot_of[n.id]) if n.id in slot_of else render_constant(n)
            hoisted.append(f"const {t.value} {name[n.id]} = {value};")
            hoisted_ids.add(n.id)
        elif n.id in arg_of and "j" not in idx[arg_of[n.id]]:
            load = t.load.format(f"p{arg_of[n.id]}[{idx[arg_of[n.id]]}]")
            hoisted.append(f"const {t.value} {name[n.id]} = {load};")
            hoisted_ids.add(n.id)
    loaded: set[tuple[int, int]] = set()

    def use(i: int, s: int) -> None:
        """Make node ``i``'s value available as ``name[i]`` in stage ``s``."""
        if (i, s) in loaded or i in hoisted_ids:
            return
        loaded.add((i, s))
        t = ct[i]
        if i in arg_of:
            k = arg_of[i]
            stages[s].append(f"const {t.value} {name[i]} = {t.load.format(f'p{k}[{idx[k]}]')};")
        elif stage[i] < s:
            stages[s].append(f"const {t.value} {name[i]} = t{name[i]}[j - jb];")

    for n in nodes:
        if n.id not in exprs:
            continue
        s = stage[n.id]
        for i in n.inputs:
            use(i, s)
        t = ct[n.id]
        stages[s].append(f"const {t.value} {name[n.id]} = ({t.value})({exprs[n.id]});")
        loaded.add((n.id, s))
        if n.id in crossing:
            temps.append(f"{t.value} t{name[n.id]}[{STAGE_BLOCK}] __attribute__((aligned(64)));")
            stages[s].append(f"t{name[n.id]}[j - jb] = {name[n.id]};")
    use(out_id, last)
    k = len(operands) - 1
    stages[last].append(f"p{k}[{idx[k]}] = {operands[k].ctype.store.format(name[out_id])};")
    return LoopBody(hoisted, stages, temps)
