"""Random programs for the differential fuzzer (tests/fuzz/test_differential.py).

In: hypothesis draws. Out: a :class:`Program`, a list of values (inputs, params and steps
over earlier values, each with its shape) that :func:`build` turns into an rlx Graph and
:func:`tests.fuzz.oracle.run` evaluates independently. Steps: elementwise unary and
binary ops with NumPy broadcasting, scalar ops, matmul (often with params on both sides,
so param-only products land in the executor's prologue), softmax / log_softmax,
layer_norm / rms_norm, reductions, reshape / transpose, concat / narrow, where over a
comparison, cast round trips through f16 / bf16, and the spelled-out multi-head
attention chain (which ``fuse_attention`` fuses). Every step that no later step reads
is an output, so nothing is dead code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from hypothesis import strategies as st

import rlx
from rlx.ir.mir import Graph, NodeId

__all__ = ["LN_EPS", "NEAR", "THRESHOLDS", "Leaf", "Program", "Step", "attention_mask",
           "build", "programs"]  # fmt: skip

LN_EPS = 0.1  # layer_norm's eps: bounds how much it amplifies rounding on flat rows
DIMS = st.sampled_from((1, 2, 3, 4, 5, 8, 17))

# ---- the program description -----------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One instruction: ``op`` with attributes ``args`` over earlier values ``ins``."""

    op: str
    ins: tuple[int, ...]
    args: tuple = ()


@dataclass(frozen=True, slots=True)
class Leaf:
    """An input or a param."""

    kind: str  # "input" | "param"
    name: str


@dataclass
class Program:
    """Values in order: value ``i`` is ``values[i]``, a Leaf or a Step over earlier
    values, of shape ``shapes[i]``."""

    values: list[Leaf | Step] = field(default_factory=list)
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    param_only: list[bool] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)

    @property
    def leaves(self) -> list[tuple[int, Leaf]]:
        return [(i, v) for i, v in enumerate(self.values) if isinstance(v, Leaf)]

    def leaf(self, kind: str, shape: tuple[int, ...]) -> int:
        self.values.append(Leaf(kind, f"{kind[0]}{len(self.values)}"))
        self.shapes.append(shape)
        self.param_only.append(kind == "param")
        return len(self.shapes) - 1

    def add(self, step: Step, shape: tuple[int, ...]) -> int:
        self.values.append(step)
        self.shapes.append(tuple(shape))
        self.param_only.append(all(self.param_only[i] for i in step.ins))
        return len(self.shapes) - 1


UNARY = ("tanh", "sigmoid", "relu", "neg", "abs", "sin", "cos", "gelu", "silu", "exp_tanh")
BINARY = ("add", "sub", "mul", "max", "min", "div_safe")
REDUCE = ("sum", "mean", "max")
CMP = ("gt", "lt", "ge")
THRESHOLDS = (-0.5, 0.0, 0.75)
# Leaf values are drawn next to the thresholds too (one in eight, see NEAR): a value that
# rounds onto its threshold in f16 / bf16 checks that a comparison reads its operand
# unrounded wherever fusion puts it (the precision pass once fed a fused comparison its
# input rounded to the region's dtype: x = -0.5000084 < -0.5 was false there).
NEAR = (1e-7, 3e-3)  # |leaf - threshold| for those values: log-uniform in this range


def _broadcasts(a: tuple[int, ...] | None, b: tuple[int, ...]) -> tuple[int, ...] | None:
    if a is None:
        return None
    try:
        return tuple(np.broadcast_shapes(a, b))
    except ValueError:
        return None


@st.composite
def programs(draw: st.DrawFn) -> Program:
    """A random program over one or two inputs and a few params (see module docstring)."""
    p = Program()
    r, c, k = draw(DIMS), draw(DIMS), draw(DIMS)
    p.leaf("input", draw(st.sampled_from([(r, c), (1, r, c)])))
    if draw(st.booleans()):
        p.leaf("input", draw(st.sampled_from([(1, c), (r, 1), (c,), (r, c)])))
    p.leaf("param", (c, k))  # p @ q and x @ (p @ q) are param-only / prologue products
    p.leaf("param", (k, c))
    for _ in range(draw(st.integers(1, 12))):
        op = draw(st.sampled_from(("unary", "binary", "scalar", "matmul", "matmul", "softmax",
                                   "log_softmax", "layer_norm", "rms_norm", "reduce",
                                   "transpose", "reshape", "concat", "narrow", "where",
                                   "cast", "attention")))  # fmt: skip
        a = draw(st.integers(0, len(p.shapes) - 1))
        sa = p.shapes[a]
        if op == "unary":
            p.add(Step("unary", (a,), (draw(st.sampled_from(UNARY)),)), sa)
        elif op == "binary":
            fits = [i for i, s in enumerate(p.shapes) if _broadcasts(sa, s) is not None]
            b = draw(st.sampled_from(fits))
            fn = draw(st.sampled_from(BINARY))
            p.add(Step("binary", (a, b), (fn,)), _broadcasts(sa, p.shapes[b]))  # type: ignore[arg-type]
        elif op == "scalar":
            fn = draw(st.sampled_from(("add", "mul", "sub")))
            val = draw(st.sampled_from((0.5, -1.25, 2.0, 3.0)))
            p.add(Step("scalar", (a,), (fn, val)), sa)
        elif op == "matmul" and len(sa) >= 2:
            kk = sa[-1]
            fits = [i for i, s in enumerate(p.shapes) if len(s) == 2 and s[0] == kk]
            if fits and draw(st.booleans()):
                b = draw(st.sampled_from(fits))
            else:
                b = p.leaf("param", (kk, draw(DIMS)))
            p.add(Step("matmul", (a, b)), (*sa[:-1], p.shapes[b][1]))
        elif op in ("softmax", "log_softmax"):
            p.add(Step(op, (a,)), sa)
        elif op == "layer_norm":
            gamma = p.leaf("param", sa[-1:])
            beta = p.leaf("param", sa[-1:])
            p.add(Step("layer_norm", (a, gamma, beta)), sa)
        elif op == "rms_norm":
            p.add(Step("rms_norm", (a, p.leaf("param", sa[-1:]))), sa)
        elif op == "reduce":
            axis = draw(st.integers(0, len(sa) - 1))
            keep = draw(st.booleans()) or len(sa) == 1
            fn = draw(st.sampled_from(REDUCE))
            shape = tuple(1 if i == axis else d for i, d in enumerate(sa)) if keep else (
                sa[:axis] + sa[axis + 1 :]
            )  # fmt: skip
            p.add(Step("reduce", (a,), (fn, axis, keep)), shape)
        elif op == "transpose" and len(sa) == 2:
            p.add(Step("transpose", (a,)), sa[::-1])
        elif op == "reshape":
            n = math.prod(sa)
            divs = [d for d in range(1, n + 1) if n % d == 0]
            d = draw(st.sampled_from(divs))
            shape = draw(st.sampled_from([(n // d, d), (n,), (d, n // d), (1, n // d, d)]))
            p.add(Step("reshape", (a,), (shape,)), shape)
        elif op == "concat":
            axis = draw(st.integers(0, len(sa) - 1))
            fits = [
                i for i, s in enumerate(p.shapes)
                if len(s) == len(sa) and all(x == y for j, (x, y) in enumerate(zip(s, sa))
                                             if j != axis)
            ]  # fmt: skip
            b = draw(st.sampled_from(fits))
            shape = tuple(d + p.shapes[b][axis] if j == axis else d for j, d in enumerate(sa))
            if shape[axis] > 40:  # keeps programs small
                continue
            p.add(Step("concat", (a, b), (axis,)), shape)
        elif op == "narrow":
            axis = draw(st.integers(0, len(sa) - 1))
            start = draw(st.integers(0, sa[axis] - 1))
            length = draw(st.integers(1, sa[axis] - start))
            shape = tuple(length if j == axis else d for j, d in enumerate(sa))
            p.add(Step("narrow", (a,), (axis, start, length)), shape)
        elif op == "where":
            # the condition compares a leaf (exact in f32 under every policy) with a
            # threshold: a comparison on rounded values could flip, which is no bug
            leaves = [i for i, _ in p.leaves if _broadcasts(p.shapes[i], sa)]
            if not leaves:
                continue
            cond = draw(st.sampled_from(leaves))
            fits = [i for i, s in enumerate(p.shapes) if _broadcasts(_broadcasts(sa, s), p.shapes[cond])]  # fmt: skip
            b = draw(st.sampled_from(fits))
            shape = np.broadcast_shapes(sa, p.shapes[b], p.shapes[cond])
            args = (draw(st.sampled_from(CMP)), draw(st.sampled_from(THRESHOLDS)))
            p.add(Step("where", (cond, a, b), args), tuple(shape))
        elif op == "cast":
            p.add(Step("cast", (a,), (draw(st.sampled_from(("f16", "bf16"))),)), sa)
        elif op == "attention" and any(len(s) == 3 and s[0] == 1 for s in p.shapes):
            a = draw(st.sampled_from([i for i, s in enumerate(p.shapes) if len(s) == 3 and s[0] == 1]))  # fmt: skip
            sa = p.shapes[a]
            # the spelled-out chain (fuse_attention fuses it when fuse=True) with q = a
            # and k = v = another [1, Skv, H*D] value; masks hide keys so that every query
            # sees one (a row that sees none is covered by tests/cpu/kernels/test_nn_attention_masked.py)
            fits = [i for i, s in enumerate(p.shapes) if len(s) == 3 and s[::2] == sa[::2]]
            kv = draw(st.sampled_from(fits))
            heads = draw(st.sampled_from([h for h in (1, 2, 4) if sa[2] % h == 0]))
            sq, skv = sa[1], p.shapes[kv][1]
            mask = draw(st.sampled_from(("none", "causal", "lowest")))
            if mask == "causal" and sq > skv:
                mask = "none"
            seen = draw(st.integers(0, 2**16))  # seeds which keys a "lowest" mask hides
            p.add(Step("attention", (a, kv), (heads, mask, seen)), sa)
    last = len(p.shapes) - 1
    if isinstance(p.values[last], Leaf):  # no step was drawn last: one unary step
        last = p.add(Step("unary", (last,), ("tanh",)), p.shapes[last])
    # every step no later step reads is an output (nothing is dead code), and a
    # param-only value if there is one: the prologue's result itself
    read = {i for v in p.values if isinstance(v, Step) for i in v.ins}
    steps = [i for i, v in enumerate(p.values) if isinstance(v, Step)]
    p.outputs = [i for i in steps if i not in read]
    derived = [i for i in steps if p.param_only[i] and i not in p.outputs]
    if derived:
        p.outputs.append(draw(st.sampled_from(derived)))
    return p


def attention_mask(sq: int, skv: int, kind: str, seen: int) -> np.ndarray | None:
    """The additive [Sq, Skv] f32 mask of an attention step (None for "none")."""
    if kind == "none":
        return None
    if kind == "causal":
        hide = np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)
        return np.where(hide, -np.inf, 0.0).astype(np.float32)
    hide = np.random.default_rng(seen).random((sq, skv)) < 0.5
    hide[np.arange(sq), np.arange(sq) % skv] = False  # every query sees a key
    return np.where(hide, np.finfo(np.float32).min, 0.0).astype(np.float32)


def _attention(g: Graph, q: NodeId, kv: NodeId, heads: int, kind: str, seen) -> NodeId:
    """The multi-head attention chain on [1, S, H*D] q and kv."""
    (_, sq, hd), skv = g.node(q).shape.dims, g.node(kv).shape.dims[1]
    d = hd // heads
    qh = g.transpose(g.reshape(q, (1, sq, heads, d)), (0, 2, 1, 3))
    kt = g.transpose(g.reshape(kv, (1, skv, heads, d)), (0, 2, 3, 1))
    vh = g.transpose(g.reshape(kv, (1, skv, heads, d)), (0, 2, 1, 3))
    s = g.mul(g.matmul(qh, kt), 1.0 / math.sqrt(d))
    m = attention_mask(sq, skv, kind, seen)
    if m is not None:
        s = g.add(s, g.constant(m))
    o = g.matmul(g.softmax(s, -1), vh)
    return g.reshape(g.transpose(o, (0, 2, 1, 3)), (1, sq, hd))


# ---- the rlx graph of the description --------------------------------------------------


def build(p: Program) -> Graph:
    g = rlx.Graph("fuzz")
    ids: list[NodeId] = []
    for s, shape in zip(p.values, p.shapes, strict=True):
        if isinstance(s, Leaf):
            ids.append(g.input(s.name, shape) if s.kind == "input" else g.param(s.name, shape))
            continue
        x = [ids[i] for i in s.ins]
        if s.op == "unary":
            fn = s.args[0]
            y = g.exp(g.tanh(x[0])) if fn == "exp_tanh" else getattr(g, fn)(x[0])
        elif s.op == "binary":
            fn = s.args[0]
            if fn == "div_safe":
                y = g.div(x[0], g.add(g.abs(x[1]), 1.0))
            else:
                y = getattr(g, {"max": "maximum", "min": "minimum"}.get(fn, fn))(x[0], x[1])
        elif s.op == "scalar":
            y = getattr(g, s.args[0])(x[0], s.args[1])
        elif s.op == "matmul":
            y = g.matmul(x[0], x[1])
        elif s.op == "softmax":
            y = g.softmax(x[0], -1)
        elif s.op == "log_softmax":
            y = g.log_softmax(x[0], -1)
        elif s.op == "rms_norm":
            y = g.rms_norm(x[0], x[1], eps=LN_EPS)
        elif s.op == "layer_norm":
            y = g.layer_norm(x[0], x[1], x[2], eps=LN_EPS)
        elif s.op == "reduce":
            fn, axis, keep = s.args
            y = getattr(g, fn)(x[0], axis, keep)
        elif s.op == "transpose":
            y = g.transpose(x[0])
        elif s.op == "reshape":
            y = g.reshape(x[0], s.args[0])
        elif s.op == "concat":
            y = g.concat(x, s.args[0])
        elif s.op == "narrow":
            y = g.narrow(x[0], *s.args)
        elif s.op == "where":
            cmp, th = s.args
            y = g.where(getattr(g, cmp)(x[0], th), x[1], x[2])
        elif s.op == "attention":
            y = _attention(g, x[0], x[1], *s.args)
        elif s.op == "cast":
            y = g.cast(g.cast(x[0], s.args[0]), "f32")
        else:  # pragma: no cover
            raise AssertionError(s.op)
        ids.append(y)
    g.set_outputs([ids[i] for i in p.outputs])
    return g
