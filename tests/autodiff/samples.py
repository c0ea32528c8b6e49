"""Sample graphs for the generic gradient check (test_registry_rules.py): one builder per
differentiable op (``"mnemonic"``) or per kind of a kinded op (``"unary:tanh"``). A builder
takes a hypothesis ``data`` object and returns a :class:`Case`: an f64 graph (f32 / c64
where the op knows no f64, with a looser step and tolerance), values for its inputs and
the names to differentiate. Values stay away from kinks and poles (relu at 0, floor at
integers, max ties), where a central difference is not the derivative."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import strategies as st

import rlx
from rlx.ops.elementwise import Binary, BinaryKind, Unary, UnaryKind
from rlx.ops.fft import Fft, FftKind
from rlx.ops.reduce import ReduceKind
from rlx.ops.trig import Trig, TrigKind


@dataclass
class Case:
    graph: rlx.Graph
    values: dict[str, np.ndarray]
    wrt: list[str]
    eps: float = 1e-6
    rtol: float = 1e-5
    atol: float = 1e-7
    # the rules are a chosen surrogate (a straight-through estimator), not the derivative:
    # only vjp against jvp is checked (<J^T u, v> == <u, J v>), not finite differences
    surrogate: bool = False


@dataclass
class B:
    """A sample being built: ``g``, a seeded generator, the values so far."""

    data: Any
    name: str
    g: rlx.Graph = field(init=False)
    rng: np.random.Generator = field(init=False)
    values: dict[str, np.ndarray] = field(default_factory=dict)
    diff: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.g = rlx.Graph(self.name)
        self.rng = np.random.default_rng(self.data.draw(st.integers(0, 2**32 - 1), "seed"))

    def dims(self, lo: int = 1, hi: int = 3, side: int = 3) -> list[int]:
        n = self.data.draw(st.integers(lo, hi), "rank")
        return [self.data.draw(st.integers(1, side)) for _ in range(n)]

    def inp(self, value: np.ndarray, diff: bool = True) -> int:
        """An input holding ``value`` (differentiated unless ``diff`` is False)."""
        name = f"x{len(self.values)}"
        value = np.asarray(value)
        self.values[name] = value
        if diff:
            self.diff.append(name)
        return self.g.input(name, list(value.shape), rlx.DType.from_numpy(value.dtype))

    def normal(self, dims: list[int], dtype: Any = np.float64) -> np.ndarray:
        return self.rng.standard_normal(dims).astype(dtype)

    def uniform(self, dims: list[int], lo: float, hi: float) -> np.ndarray:
        return self.rng.uniform(lo, hi, dims)

    def distinct(self, dims: list[int]) -> np.ndarray:
        """Values at least 0.2 apart (no ties for max / min / sort)."""
        n = int(np.prod(dims))
        return (
            self.rng.permutation(n) * 0.3 - 0.15 * n + self.rng.uniform(-0.05, 0.05, n)
        ).reshape(dims)

    def done(self, *outs: int, **tol: float) -> Case:
        self.g.set_outputs(list(outs))
        return Case(self.g, self.values, list(self.diff), **tol)


Builder = Callable[[Any], Case]
SAMPLES: dict[str, Builder] = {}
F32 = {"eps": 1e-2, "rtol": 1e-3, "atol": 1e-4}  # linear ops in f32 / c64


def sample(name: str) -> Callable[[Callable[[B], Case]], Callable[[B], Case]]:
    def deco(fn: Callable[[B], Case]) -> Callable[[B], Case]:
        SAMPLES[name] = lambda data: fn(B(data, name.replace(":", "_")))
        return fn

    return deco


# ---- kinded elementwise ops: the domain each kind is smooth on -----------------------


def _away_from_zero(b: B, d: list[int]) -> np.ndarray:
    return b.uniform(d, 0.2, 2.0) * b.rng.choice([-1.0, 1.0], d)


def _between_integers(b: B, d: list[int]) -> np.ndarray:
    return b.rng.integers(-3, 3, d) + b.uniform(d, 0.2, 0.8)


def _near_integers(b: B, d: list[int]) -> np.ndarray:
    return b.rng.integers(-3, 3, d) + b.uniform(d, -0.3, 0.3)


ANY = lambda b, d: b.normal(d)  # noqa: E731
POS = lambda b, d: b.uniform(d, 0.5, 2.0)  # noqa: E731
UNARY_DOMAIN = {
    UnaryKind.RELU: _away_from_zero,
    UnaryKind.GELU: ANY,
    UnaryKind.GELU_TANH: ANY,
    UnaryKind.SILU: ANY,
    UnaryKind.SIGMOID: ANY,
    UnaryKind.TANH: ANY,
    UnaryKind.EXP: ANY,
    UnaryKind.LOG: POS,
    UnaryKind.SQRT: POS,
    UnaryKind.RSQRT: POS,
    UnaryKind.NEG: ANY,
    UnaryKind.ABS: _away_from_zero,
    UnaryKind.SIN: ANY,
    UnaryKind.COS: ANY,
    UnaryKind.ROUND: _near_integers,
    UnaryKind.FLOOR: _between_integers,
    UnaryKind.CEIL: _between_integers,
    UnaryKind.RECIP: _away_from_zero,
    UnaryKind.SQUARE: ANY,
    UnaryKind.SOFTPLUS: ANY,
    UnaryKind.ERF: ANY,
    UnaryKind.SIGN: _away_from_zero,
}
TRIG_DOMAIN = {
    TrigKind.TAN: lambda b, d: b.uniform(d, -1.2, 1.2),
    TrigKind.ASIN: lambda b, d: b.uniform(d, -0.8, 0.8),
    TrigKind.ACOS: lambda b, d: b.uniform(d, -0.8, 0.8),
    TrigKind.ATAN: ANY,
    TrigKind.SINH: ANY,
    TrigKind.COSH: ANY,
    TrigKind.ASINH: ANY,
    TrigKind.ACOSH: lambda b, d: b.uniform(d, 1.2, 3.0),
    TrigKind.ATANH: lambda b, d: b.uniform(d, -0.8, 0.8),
}
KINDS: dict[str, list[Any]] = {
    "unary": list(UnaryKind),
    "binary": list(BinaryKind),
    "trig": list(TrigKind),
    "reduce": list(ReduceKind),
    "fft": list(FftKind),
}
NO_GRADIENT_KINDS = {
    ("unary", UnaryKind.NOT): "bool in, bool out",
    ("binary", BinaryKind.AND): "bool / integer only",
    ("binary", BinaryKind.OR): "bool / integer only",
}


def _unary(kind: UnaryKind) -> None:
    @sample(f"unary:{kind.value}")
    def build(b: B) -> Case:
        d = b.dims(0, 3)
        domain = UNARY_DOMAIN.get(kind, ANY)  # a kind not listed: smooth on the real line
        return b.done(b.g.apply(Unary(kind), [b.inp(domain(b, d))]))


def _trig(kind: TrigKind) -> None:
    @sample(f"trig:{kind.value}")
    def build(b: B) -> Case:
        d = b.dims(0, 3)
        return b.done(b.g.apply(Trig(kind), [b.inp(TRIG_DOMAIN[kind](b, d))]))


for _k in UnaryKind:
    if ("unary", _k) not in NO_GRADIENT_KINDS:
        _unary(_k)
for _t in TRIG_DOMAIN:
    _trig(_t)


def _broadcast_pair(b: B) -> tuple[list[int], list[int]]:
    """Two shapes that broadcast: ``y`` drops leading dims of ``x`` and sets some to 1."""
    xd = b.dims(0, 3)
    cut = b.data.draw(st.integers(0, len(xd)))
    yd = [d if b.data.draw(st.booleans()) else 1 for d in xd[cut:]]
    return (xd, yd) if b.data.draw(st.booleans()) else (yd, xd)


def _binary_values(b: B, kind: BinaryKind, ad: list[int], bd: list[int]) -> tuple[Any, Any]:
    """Operand values where ``kind`` is smooth. One operand always has the broadcast
    shape (see _broadcast_pair); it is set relative to the other."""
    av, bv = b.normal(ad), b.normal(bd)
    full = np.broadcast_shapes(av.shape, bv.shape)
    if kind is BinaryKind.DIV:
        return av, _away_from_zero(b, bd)
    if kind is BinaryKind.POW:
        return POS(b, ad), bv
    if kind in (BinaryKind.MAX, BinaryKind.MIN):  # |a - b| >= 0.2: no ties
        gap = _away_from_zero(b, list(full))
        if av.shape == full:
            return np.broadcast_to(bv, full) + gap, bv
        return av, np.broadcast_to(av, full) + gap
    if kind is BinaryKind.MOD:  # a / b = k + frac, away from mod's jumps at integers
        q = b.rng.integers(1, 3, full) + b.uniform(list(full), 0.2, 0.8)
        if av.shape == full:
            bv = _away_from_zero(b, bd)
            return np.broadcast_to(bv, full) * q, bv
        av = _away_from_zero(b, ad)
        return av, np.broadcast_to(av, full) / q
    return av, bv


def _binary(kind: BinaryKind) -> None:
    @sample(f"binary:{kind.value}")
    def build(b: B) -> Case:
        ad, bd = _broadcast_pair(b)
        av, bv = _binary_values(b, kind, ad, bd)
        return b.done(b.g.apply(Binary(kind), [b.inp(av), b.inp(bv)]))


for _b in BinaryKind:
    if ("binary", _b) not in NO_GRADIENT_KINDS:
        _binary(_b)


def _reduce(kind: ReduceKind) -> None:
    @sample(f"reduce:{kind.value}")
    def build(b: B) -> Case:
        d = b.dims(1, 3)
        axes = b.data.draw(st.lists(st.integers(0, len(d) - 1), min_size=1, unique=True))
        keep = b.data.draw(st.booleans())
        if kind is ReduceKind.PROD:
            v = b.uniform(d, 0.5, 1.5) * b.rng.choice([-1.0, 1.0], d)
        elif kind in (ReduceKind.MAX, ReduceKind.MIN):
            v = b.distinct(d)
        else:
            v = b.normal(d)
        return b.done(b.g.reduce(kind, b.inp(v), axes, keepdims=keep))


for _r in ReduceKind:
    _reduce(_r)


def _fft(kind: FftKind) -> None:
    @sample(f"fft:{kind.value}")
    def build(b: B) -> Case:
        d = b.dims(1, 2, side=4)
        axis = b.data.draw(st.integers(-len(d), len(d) - 1))
        if kind is FftKind.RFFT:
            x = b.normal(d, np.float32)
            n = None
        else:
            x = (b.normal(d) + 1j * b.normal(d)).astype(np.complex64)
            n = 2 * (d[axis] - 1) if kind is FftKind.IRFFT and d[axis] > 1 else None
            if kind is FftKind.IRFFT and n is None:
                n = 1
        return b.done(b.g.apply(Fft(kind, axis=axis, n=n), [b.inp(x)]), **F32)


for _f in FftKind:
    _fft(_f)


# ---- one sample per op ----------------------------------------------------------------


@sample("cast")
def _cast(b: B) -> Case:
    x = b.inp(b.normal(b.dims(0, 3)))
    return b.done(b.g.cast(b.g.mul(b.g.cast(x, "f32"), b.g.cast(x, "f32")), "f64"), **F32)


@sample("where")
def _where(b: B) -> Case:
    xd, yd = _broadcast_pair(b)
    c = b.inp(b.rng.random(yd) > 0.5, diff=False)
    return b.done(b.g.where(c, b.inp(b.normal(xd)), b.inp(b.normal(yd))))


@sample("stop_gradient")
def _stop_gradient(b: B) -> Case:
    """Zero derivative by definition (finite differences see the identity)."""
    x = b.inp(b.normal(b.dims()))
    c = b.done(b.g.mul(x, b.g.stop_gradient(b.g.exp(x))))
    c.surrogate = True
    return c


@sample("barrier")
def _barrier(b: B) -> Case:
    return b.done(b.g.barrier(b.g.sin(b.inp(b.normal(b.dims())))))


@sample("reshape")
def _reshape(b: B) -> Case:
    d = b.dims(1, 3)
    return b.done(b.g.reshape(b.inp(b.normal(d)), [int(np.prod(d))]))


@sample("transpose")
def _transpose(b: B) -> Case:
    d = b.dims(1, 3)
    perm = b.data.draw(st.permutations(range(len(d))))
    return b.done(b.g.transpose(b.inp(b.normal(d)), list(perm)))


@sample("expand")
def _expand(b: B) -> Case:
    d = b.dims(1, 2)
    lo = [1 if b.data.draw(st.booleans()) else n for n in d]
    return b.done(b.g.expand(b.inp(b.normal(lo)), [2, *d]))


@sample("concat")
def _concat(b: B) -> Case:
    d = b.dims(1, 3)
    axis = b.data.draw(st.integers(0, len(d) - 1))
    e = list(d)
    e[axis] += 1
    return b.done(b.g.concat([b.inp(b.normal(d)), b.inp(b.normal(e))], axis))


@sample("narrow")
def _narrow(b: B) -> Case:
    d = [n + 1 for n in b.dims(1, 3)]
    axis = b.data.draw(st.integers(0, len(d) - 1))
    return b.done(b.g.narrow(b.inp(b.normal(d)), axis, 1, d[axis] - 1))


@sample("slice")
def _slice(b: B) -> Case:
    d = [n + 2 for n in b.dims(1, 2)]
    step = b.data.draw(st.sampled_from([1, 2, -1]))
    starts = [None if step < 0 else 1] * len(d)
    return b.done(b.g.slice(b.inp(b.normal(d)), starts, [None] * len(d), [step] * len(d)))


@sample("pad")
def _pad(b: B) -> Case:
    d = b.dims(1, 3)
    pads = [(b.data.draw(st.integers(0, 2)), b.data.draw(st.integers(0, 2))) for _ in d]
    return b.done(b.g.pad(b.inp(b.normal(d)), pads, 0.5))


@sample("gather")
def _gather(b: B) -> Case:
    d = b.dims(1, 3)
    axis = b.data.draw(st.integers(0, len(d) - 1))
    idx = b.inp(b.rng.integers(0, d[axis], (4,)).astype(np.int32), diff=False)
    return b.done(b.g.gather(b.inp(b.normal(d)), idx, axis))


@sample("gather_backward")
def _gather_backward(b: B) -> Case:
    idx = b.inp(b.rng.integers(-4, 4, (2, 3)).astype(np.int32), diff=False)
    return b.done(b.g.gather_backward(b.inp(b.normal([3, 2, 3])), idx, 1, (3, 4)))


@sample("scatter_add")
def _scatter_add(b: B) -> Case:
    x = b.normal([4, 3])
    idx = b.inp(b.rng.integers(0, 4, (5,)).astype(np.int32), diff=False)
    return b.done(b.g.scatter_add(b.inp(x), idx, b.inp(b.normal([5, 3])), 0))


def _indexing(name: str) -> Any:
    from rlx.ops import indexing

    return getattr(indexing, name)


@sample("gather_elements")
def _gather_elements(b: B) -> Case:
    idx = b.inp(b.rng.integers(0, 4, (3, 2)).astype(np.int64), diff=False)
    return b.done(b.g.apply(_indexing("GatherElements")(0), [b.inp(b.normal([4, 2])), idx]))


@sample("gather_nd")
def _gather_nd(b: B) -> Case:
    idx = b.inp(b.rng.integers(0, 3, (4, 2)).astype(np.int64), diff=False)
    return b.done(b.g.apply(_indexing("GatherNd")(0), [b.inp(b.normal([3, 3, 2])), idx]))


def _scatter(b: B, name: str, x: np.ndarray, idx: np.ndarray, upd: np.ndarray) -> Case:
    red = _indexing("ScatterReduction")
    kind = b.data.draw(st.sampled_from([red.ADD, red.NONE]))
    op = _indexing(name)
    args = (0, kind) if name == "ScatterElements" else (kind,)
    ins = [b.inp(x), b.inp(idx, diff=False), b.inp(upd)]
    return b.done(b.g.apply(op(*args), ins))


@sample("scatter_elements")
def _scatter_elements(b: B) -> Case:
    idx = np.stack([b.rng.permutation(4)[:3] for _ in range(2)], 1).astype(np.int64)
    return _scatter(b, "ScatterElements", b.normal([4, 2]), idx, b.normal([3, 2]))


@sample("scatter_nd")
def _scatter_nd(b: B) -> Case:
    idx = b.rng.permutation(4)[:3].reshape(3, 1).astype(np.int64)
    return _scatter(b, "ScatterNd", b.normal([4, 2]), idx, b.normal([3, 2]))


@sample("cumsum")
def _cumsum(b: B) -> Case:
    d = b.dims(1, 3)
    axis = b.data.draw(st.integers(0, len(d) - 1))
    rev, exc = b.data.draw(st.booleans()), b.data.draw(st.booleans())
    return b.done(b.g.cumsum(b.inp(b.normal(d)), axis, rev, exc))


@sample("cumprod")
def _cumprod(b: B) -> Case:
    from rlx.ops.cumulative import CumProd

    d = b.dims(1, 3)
    axis = b.data.draw(st.integers(0, len(d) - 1))
    rev, exc = b.data.draw(st.booleans()), b.data.draw(st.booleans())
    x = b.uniform(d, 0.5, 1.5) * b.rng.choice([-1.0, 1.0], d)
    return b.done(b.g.apply(CumProd(axis, rev, exc), [b.inp(x)]))


@sample("topk")
def _topk(b: B) -> Case:
    d = [n + 1 for n in b.dims(1, 2)]
    k = b.data.draw(st.integers(1, d[-1]))
    vals, _ = b.g.topk(b.inp(b.distinct(d)), k, -1, b.data.draw(st.booleans()))
    return b.done(vals)


@sample("softmax")
def _softmax(b: B) -> Case:
    d = b.dims(1, 3)
    return b.done(b.g.softmax(b.inp(b.normal(d)), b.data.draw(st.integers(-len(d), len(d) - 1))))


@sample("log_softmax")
def _log_softmax(b: B) -> Case:
    d = b.dims(1, 3)
    return b.done(b.g.log_softmax(b.inp(b.normal(d)), -1))


@sample("softmax_backward")
def _softmax_backward(b: B) -> Case:
    d = b.dims(1, 3)
    y = b.g.softmax(b.inp(b.normal(d)), -1)
    return b.done(b.g.softmax_backward(b.inp(b.normal(d)), y, -1))


@sample("log_softmax_backward")
def _log_softmax_backward(b: B) -> Case:
    d = b.dims(1, 3)
    y = b.g.log_softmax(b.inp(b.normal(d)), -1)
    return b.done(b.g.log_softmax_backward(b.inp(b.normal(d)), y, -1))


@sample("matmul")
def _matmul(b: B) -> Case:
    m, k, n = (b.data.draw(st.integers(1, 3)) for _ in range(3))
    lead = b.dims(0, 1)
    return b.done(b.g.matmul(b.inp(b.normal([*lead, m, k])), b.inp(b.normal([k, n]))))


@sample("dot_general")
def _dot_general(b: B) -> Case:
    x, y = b.inp(b.normal([2, 3, 4])), b.inp(b.normal([2, 4, 3]))
    return b.done(b.g.dot_general(x, y, ((2,), (1,)), ((0,), (0,))))


@sample("dense_solve")
def _dense_solve(b: B) -> Case:
    a = b.normal([3, 3]) + 3 * np.eye(3)
    return b.done(b.g.dense_solve(b.inp(a), b.inp(b.normal([3, 2]))))


@sample("batched_dense_solve")
def _batched_dense_solve(b: B) -> Case:
    from rlx.ops.linalg import BatchedDenseSolve

    a = b.normal([2, 3, 3]) + 3 * np.eye(3)
    return b.done(b.g.apply(BatchedDenseSolve(), [b.inp(a), b.inp(b.normal([2, 3, 2]))]))


@sample("grouped_matmul")
def _grouped_matmul(b: B) -> Case:
    idx = b.inp(b.rng.integers(0, 2, (4,)).astype(np.int32), diff=False)
    return b.done(b.g.grouped_matmul(b.inp(b.normal([4, 3])), b.inp(b.normal([2, 3, 2])), idx))


@sample("lora_matmul")
def _lora_matmul(b: B) -> Case:
    ins = [b.inp(b.normal(d)) for d in ([2, 3], [3, 4], [3, 2], [2, 4])]
    return b.done(b.g.lora_matmul(*ins, scale=0.5))


@sample("layer_norm")
def _layer_norm(b: B) -> Case:
    d = [*b.dims(0, 2), 4]
    return b.done(b.g.layer_norm(b.inp(b.normal(d)), b.inp(b.normal([4])), b.inp(b.normal([4]))))


@sample("rms_norm")
def _rms_norm(b: B) -> Case:
    d = [*b.dims(0, 2), 4]
    return b.done(b.g.rms_norm(b.inp(b.normal(d)), b.inp(b.normal([4]))))


@sample("group_norm")
def _group_norm(b: B) -> Case:
    x, ga, be = b.inp(b.normal([2, 4, 3])), b.inp(b.normal([4])), b.inp(b.normal([4]))
    return b.done(b.g.group_norm(x, ga, be, 2))


@sample("rope")
def _rope(b: B) -> Case:
    ang = b.uniform([3, 2], -3, 3)
    cos, sin = b.inp(np.cos(ang), diff=False), b.inp(np.sin(ang), diff=False)
    return b.done(b.g.rope(b.inp(b.normal([1, 3, 8])), cos, sin, 4))


@sample("attention")
def _attention(b: B) -> Case:
    from rlx.ops.nn import MaskKind

    mask = b.data.draw(st.sampled_from([MaskKind(), MaskKind.causal()]))
    q, k, v = (b.inp(b.normal([1, 3, 4])) for _ in range(3))
    return b.done(b.g.attention(q, k, v, 2, 2, mask=mask))


@sample("conv")
def _conv(b: B) -> Case:
    stride = b.data.draw(st.integers(1, 2))
    x, w = b.inp(b.normal([1, 2, 5, 4])), b.inp(b.normal([3, 2, 2, 2]))
    return b.done(b.g.conv(x, w, b.inp(b.normal([3])), stride=stride, padding=1))


def _pool(kind: str) -> None:
    @sample(f"pool:{kind}")
    def build(b: B) -> Case:
        x = b.inp(b.distinct([1, 2, 4, 4]))
        make = b.g.max_pool if kind == "max" else b.g.avg_pool
        return b.done(make(x, 2, b.data.draw(st.sampled_from([1, 2]))))


for _p in ("max", "avg"):
    _pool(_p)


def _pool_op(kind: str) -> Any:
    from rlx.ops.nn import Pool, PoolKind

    return Pool(PoolKind(kind), (2, 2), (2, 2), ((0, 0), (0, 0)))


@sample("pool_backward")
def _pool_backward(b: B) -> Case:
    from rlx.ops.nn_grad import PoolBackward

    fwd = _pool_op(b.data.draw(st.sampled_from(["max", "avg"])))
    x = b.inp(b.distinct([1, 2, 4, 4]), diff=fwd.fn.value == "avg")
    return b.done(b.g.apply(PoolBackward(fwd), [x, b.inp(b.normal([1, 2, 2, 2]))]))


@sample("max_pool_select")
def _max_pool_select(b: B) -> Case:
    from rlx.ops.nn_grad import MaxPoolSelect

    x = b.inp(b.distinct([1, 2, 4, 4]), diff=False)
    t = b.inp(b.normal([1, 2, 4, 4]))
    return b.done(b.g.apply(MaxPoolSelect(_pool_op("max")), [x, t]))


@sample("fake_quantize")
def _fake_quantize(b: B) -> Case:
    """Straight-through: the rule is a chosen surrogate, not the (zero) derivative."""
    x = b.inp(b.normal([2, 3]))
    c = b.done(b.g.fake_quantize(x, 0.1))
    c.surrogate = True
    return c


@sample("fake_quantize_lsq")
def _fake_quantize_lsq(b: B) -> Case:
    x, s = b.inp(b.normal([2, 3]).astype(np.float32)), b.inp(np.float32([0.1]))
    c = b.done(b.g.fake_quantize_lsq(x, s), **F32)
    c.surrogate = True
    return c


@sample("dequant_matmul")
def _dequant_matmul(b: B) -> Case:
    from rlx.formats.schemes import Int8Block

    w = [
        b.g.constant(b.rng.integers(-127, 128, (5, 8)).astype(np.int8)),
        b.g.constant((b.rng.random((5, 2)) * 0.1 + 0.01).astype(np.float32)),
        b.g.constant(np.zeros((5, 2), np.int32)),
    ]
    x = b.inp(b.normal([3, 8], np.float32))
    return b.done(b.g.dequant_matmul(x, Int8Block(4), *w), eps=0.5, rtol=1e-4, atol=1e-4)


@sample("fused_matmul_bias_act")
def _fused_matmul_bias_act(b: B) -> Case:
    act = b.data.draw(st.sampled_from([None, UnaryKind.GELU, UnaryKind.TANH, UnaryKind.SILU]))
    x, w, bias = b.inp(b.normal([2, 3])), b.inp(b.normal([3, 4])), b.inp(b.normal([4]))
    return b.done(b.g.fused_matmul_bias_act(x, w, bias, act))


@sample("fused_swiglu")
def _fused_swiglu(b: B) -> Case:
    x, wg, wu = b.inp(b.normal([2, 3])), b.inp(b.normal([3, 4])), b.inp(b.normal([3, 4]))
    return b.done(b.g.fused_swiglu(x, wg, wu))


@sample("fused_residual_rms_norm")
def _fused_residual_rms_norm(b: B) -> Case:
    x, r, ga = b.inp(b.normal([2, 4])), b.inp(b.normal([2, 4])), b.inp(b.normal([4]))
    return b.done(b.g.fused_residual_rms_norm(x, r, ga))


@sample("fused_residual_layer_norm")
def _fused_residual_layer_norm(b: B) -> Case:
    x, r = b.inp(b.normal([2, 4])), b.inp(b.normal([2, 4]))
    ga, be = b.inp(b.normal([4])), b.inp(b.normal([4]))
    return b.done(b.g.fused_residual_layer_norm(x, r, ga, be))


@sample("if")
def _if(b: B) -> Case:
    pred = b.inp(np.asarray(b.data.draw(st.booleans())), diff=False)
    x, y = b.inp(b.normal([3])), b.inp(b.normal([3]))
    out = b.g.cond(pred, lambda s, p, q: s.mul(s.sin(p), q), lambda s, p, q: s.exp(p), [x, y])
    return b.done(out)


@sample("scan")
def _scan(b: B) -> Case:
    """A running ``c -> tanh(c * x_t + w)`` over 3 steps; the final carry and the ys."""
    c0, xs, w = b.inp(b.normal([2])), b.inp(b.normal([3, 2])), b.inp(b.normal([2]))
    out = b.data.draw(st.sampled_from([0, 1]), "output")

    def body(s: rlx.Graph, c: int, wv: int, x: int) -> list[int]:
        n = s.tanh(s.add(s.mul(c, x), wv))
        return [n, wv, s.mul(n, n)]

    return b.done(b.g.scan(body, [c0, w], [xs], output_index=0 if out == 0 else 2))


@sample("custom")
def _custom(b: B) -> Case:
    """A custom op registered with its rules (``x * sin(x)``), as users register them."""
    from rlx.ops.custom import register_custom_op

    def vjp(g: rlx.Graph, node: Any, ct: int) -> tuple[int]:
        (x,) = node.inputs
        return (g.mul(ct, g.add(g.sin(x), g.mul(x, g.cos(x)))),)

    def jvp(g: rlx.Graph, node: Any, t: tuple[int | None]) -> int:
        (x,) = node.inputs
        return g.mul(t[0], g.add(g.sin(x), g.mul(x, g.cos(x))))

    register_custom_op(
        "sample_xsinx", lambda ins, attrs: ins[0], lambda xs, attrs, ctx: xs[0] * np.sin(xs[0]),
        1, replace=True, vjp=vjp, jvp=jvp,
    )  # fmt: skip
    return b.done(b.g.custom("sample_xsinx", [b.inp(b.normal(b.dims()))]))


@sample("custom_fn")
def _custom_fn(b: B) -> Case:
    """``custom_fn`` with hand-written vjp / jvp bodies for ``x * y``."""
    x, y = b.inp(b.normal([3])), b.inp(b.normal([3]))
    out = b.g.custom_fn(
        [x, y],
        lambda s, p, q: s.mul(p, q),
        vjp=lambda s, p, q, o, d: [s.mul(d, q), s.mul(d, p)],
        jvp=lambda s, p, q, tp, tq, o: s.add(s.mul(tp, q), s.mul(p, tq)),
    )
    return b.done(out)


# ---- normalisations, attention, rope, conv, pool, fused ops (rlx/ops/nn_grad.py) ----------


def _vec(b: B, n: int) -> int:
    return b.inp(b.normal([n]))


@sample("layer_norm")
def _layer_norm(b: B) -> Case:
    d = b.dims(1, 3)
    x = b.inp(b.normal(d) * 2 + 1)
    return b.done(b.g.layer_norm(x, _vec(b, d[-1]), _vec(b, d[-1]), eps=1e-3))


@sample("rms_norm")
def _rms_norm(b: B) -> Case:
    d = b.dims(1, 3)
    return b.done(b.g.rms_norm(b.inp(b.normal(d)), _vec(b, d[-1]), eps=1e-3))


@sample("group_norm")
def _group_norm(b: B) -> Case:
    x = b.inp(b.normal([2, 4, 3]))
    return b.done(b.g.group_norm(x, _vec(b, 4), _vec(b, 4), 2, eps=1e-3))


@sample("attention")
def _attention(b: B) -> Case:
    from rlx.ops.nn import MaskKind

    mask = b.data.draw(st.sampled_from([MaskKind.none(), MaskKind.causal()]), "mask")
    q = b.inp(b.normal([2, 3, 4]))
    k, v = b.inp(b.normal([2, 4, 2])), b.inp(b.normal([2, 4, 2]))
    return b.done(b.g.attention(q, k, v, 2, 2, mask=mask, num_kv_heads=1))


@sample("rope")
def _rope(b: B) -> Case:
    x, c, s = b.inp(b.normal([2, 3, 8])), b.inp(b.normal([3, 1])), b.inp(b.normal([3, 1]))
    return b.done(b.g.rope(x, c, s, 4, n_rot=2, interleaved=b.data.draw(st.booleans())))


@sample("conv")
def _conv(b: B) -> Case:
    x, w = b.inp(b.normal([2, 4, 6])), b.inp(b.normal([4, 2, 3]))
    return b.done(b.g.conv(x, w, _vec(b, 4), stride=2, padding=1, dilation=1, groups=2))


def _pool_input(b: B) -> int:
    return b.inp(b.distinct([2, 2, 6]))


@sample("pool")
def _pool(b: B) -> Case:
    fn = b.data.draw(st.sampled_from(["max_pool", "avg_pool"]), "fn")
    return b.done(getattr(b.g, fn)(_pool_input(b), 3, stride=2, padding=1))


@sample("pool_backward")
def _pool_backward(b: B) -> Case:
    from rlx.ops.nn import Pool, PoolKind
    from rlx.ops.nn_grad import PoolBackward

    kind = b.data.draw(st.sampled_from([PoolKind.MAX, PoolKind.AVG]), "fn")
    op = Pool(kind, (3,), (2,), ((1, 1),))
    return b.done(b.g.apply(PoolBackward(op), [_pool_input(b), b.inp(b.normal([2, 2, 3]))]))


@sample("max_pool_select")
def _max_pool_select(b: B) -> Case:
    from rlx.ops.nn import Pool, PoolKind
    from rlx.ops.nn_grad import MaxPoolSelect

    op = Pool(PoolKind.MAX, (3,), (2,), ((1, 1),))
    return b.done(b.g.apply(MaxPoolSelect(op), [_pool_input(b), b.inp(b.normal([2, 2, 6]))]))


@sample("fused_matmul_bias_act")
def _fused_matmul_bias_act(b: B) -> Case:
    act = b.data.draw(st.sampled_from([None, UnaryKind.GELU, UnaryKind.TANH]), "act")
    x, w = b.inp(b.normal([2, 3])), b.inp(b.normal([3, 4]))
    return b.done(b.g.fused_matmul_bias_act(x, w, _vec(b, 4), act=act))


@sample("fused_swiglu")
def _fused_swiglu(b: B) -> Case:
    x, wg, wu = b.inp(b.normal([2, 3])), b.inp(b.normal([3, 4])), b.inp(b.normal([3, 4]))
    return b.done(b.g.fused_swiglu(x, wg, wu))


@sample("fused_residual_layer_norm")
def _fused_residual_layer_norm(b: B) -> Case:
    x, r = b.inp(b.normal([2, 5])), b.inp(b.normal([1, 5]))
    return b.done(b.g.fused_residual_layer_norm(x, r, _vec(b, 5), _vec(b, 5), eps=1e-3))


@sample("fused_residual_rms_norm")
def _fused_residual_rms_norm(b: B) -> Case:
    x, r = b.inp(b.normal([2, 5])), b.inp(b.normal([2, 5]))
    return b.done(b.g.fused_residual_rms_norm(x, r, _vec(b, 5), eps=1e-3))


@sample("elementwise_region")
def _elementwise_region(b: B) -> Case:
    x, y = b.inp(b.normal([2, 3])), b.inp(b.normal([3]))
    return b.done(
        b.g.elementwise_region([x, y], lambda s, p, q: s.mul(s.tanh(p), s.exp(s.mul(q, 0.5))))
    )


# ---- loss, complex and 2-D spatial ops (rlx/ops/loss.py, complex.py, spatial.py) -----


def _labels(b: B, lead: list[int], c: int) -> int:
    return b.inp(b.rng.integers(-c, c, lead), diff=False)


@sample("softmax_cross_entropy")
def _softmax_cross_entropy(b: B) -> Case:
    lead, c = b.dims(1, 2), b.data.draw(st.integers(1, 4), "classes")
    x = b.inp(b.normal([*lead, c]))
    return b.done(b.g.softmax_cross_entropy(x, _labels(b, lead, c)))


@sample("softmax_cross_entropy_backward")
def _softmax_cross_entropy_backward(b: B) -> Case:
    lead, c = b.dims(1, 2), b.data.draw(st.integers(1, 4), "classes")
    ct, x = b.inp(b.normal(lead)), b.inp(b.normal([*lead, c]))
    return b.done(b.g.softmax_cross_entropy_backward(ct, x, _labels(b, lead, c)))


def _c64(b: B, d: list[int]) -> np.ndarray:
    return (b.normal(d) + 1j * b.normal(d)).astype(np.complex64)


@sample("conjugate")
def _conjugate(b: B) -> Case:
    return b.done(b.g.conjugate(b.inp(_c64(b, b.dims()))), **F32)


@sample("complex_norm_sq")
def _complex_norm_sq(b: B) -> Case:
    return b.done(b.g.complex_norm_sq(b.inp(_c64(b, b.dims()))), **F32)


@sample("complex_norm_sq_backward")
def _complex_norm_sq_backward(b: B) -> Case:
    d = b.dims()
    ct, z = b.inp(b.normal(d, np.float32)), b.inp(_c64(b, d))
    return b.done(b.g.complex_norm_sq_backward(ct, z), **F32)


@sample("resize_nearest_2x")
def _resize_nearest_2x(b: B) -> Case:
    return b.done(b.g.resize_nearest_2x(b.inp(b.normal(b.dims(2, 4)))))


@sample("axial_rope_2d")
def _axial_rope_2d(b: B) -> Case:
    gh, gw = b.data.draw(st.integers(1, 3), "gh"), b.data.draw(st.integers(1, 3), "gw")
    x = b.inp(b.normal([*b.dims(0, 1), gh * gw, 8]))
    return b.done(b.g.axial_rope_2d(x, gh, gw, 4, interleaved=b.data.draw(st.booleans())))


# ---- fused transformer blocks (rlx/ops/blocks.py): the decomposition's derivatives --------


def _block_inputs(b: B, h: int, inter: int, layer: bool, bias: bool) -> tuple[list, list]:
    shapes = [[h, h]] * 4 + ([[h, inter], [inter, h]] if layer else [])
    ws = [b.inp(b.normal(s) * 0.5) for s in shapes]
    if layer:  # ln1_g, ln1_b, ln2_g, ln2_b
        ws += [b.inp(1.0 + 0.2 * b.normal([h])) if i % 2 == 0 else _vec(b, h) for i in range(4)]
    sizes = [h] * 4 + ([inter, h] if layer else [])
    return ws, ([_vec(b, n) for n in sizes] if bias else [])


@sample("fused_attention_block")
def _fused_attention_block(b: B) -> Case:
    from rlx.ops.nn import MaskKind

    mask = b.data.draw(st.sampled_from([MaskKind(), MaskKind.causal()]))
    bias = b.data.draw(st.booleans(), "bias")
    x = b.inp(b.normal([1, 3, 4]))
    ws, bs = _block_inputs(b, 4, 0, False, bias)
    return b.done(b.g.fused_attention_block(x, ws, bs if bias else None, 2, 2, mask))


@sample("fused_transformer_layer")
def _fused_transformer_layer(b: B) -> Case:
    pre = b.data.draw(st.booleans(), "pre_norm")
    x = b.inp(b.normal([1, 3, 4]))
    ws, bs = _block_inputs(b, 4, 6, True, True)
    m = b.inp(np.array([[[[0.0, 0.0, -1e9]]]]), diff=False)
    y = b.g.fused_transformer_layer(x, ws, bs, 2, 2, (1e-3, 1e-3), mask_input=m, pre_norm=pre)
    return b.done(y)


from . import samples_backward as _samples_backward  # noqa: E402,F401  (registers more samples)
