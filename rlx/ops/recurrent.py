"""Recurrent ops: the gated delta rule of Gated DeltaNet (Yang et al. 2024, the linear
attention layers of Qwen3-Next) and Mamba's selective scan (:class:`SelectiveScan`, whose
docstring gives its layouts and recurrence). Both are reductions over the sequence axis
for the precision pass, as in the seed.

Layouts (``B`` batch, ``T`` sequence, ``H`` heads, ``K = state_size`` key dim, ``V`` value
dim), the same as the Hugging Face / flash-linear-attention reference implementations:

* ``q``, ``k``: ``[B, T, H, K]``; ``v``: ``[B, T, H, V]``;
* ``g``: ``[B, T, H]``, the decay in log space (the step multiplies the state by
  ``exp(g)``, so ``g <= 0`` keeps the state bounded);
* ``beta``: ``[B, T, H]``, the write strength (usually a sigmoid output);
* ``state`` (only with ``carry=True``): ``[B, H, K, V]``, the state before step 0
  (without carry the state starts at zero).

Per batch and head, with ``S`` a ``K x V`` matrix and ``alpha_t = exp(g_t)``::

    S    = alpha_t * S_{t-1}
    S_t  = S + k_t (beta_t * (v_t - S^T k_t))^T      # the delta rule write
    o_t  = S_t^T q_t / sqrt(K)

which is ``S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t k_t v_t^T`` written as
one rank-1 update (the transpose of the ``d_v x d_k`` form in the paper). ``q`` and ``k``
are used as given: apply the L2 normalisation of Qwen3-Next before the op.

A node has one output: ``returns=GdnResult.OUTPUT`` gives ``o`` (``[B, T, H, V]``),
``GdnResult.FINAL_STATE`` gives ``S_T`` (``[B, H, K, V]``), the carry for the next call.
Float inputs of 16 bits or fewer are computed in f32 and rounded back.

HIR lowering (``rlx/ir/hir_lower.py``) emits this op under FusionPolicy.DIRECT; under
FUSABLE it builds the same recurrence as a control-flow Scan whose body is one step.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["GatedDeltaNet", "GdnResult", "gated_delta_rule", "SelectiveScan", "selective_scan_ref"]


class GdnResult(enum.Enum):
    """Which result of the recurrence a GatedDeltaNet node returns."""

    OUTPUT = "output"
    FINAL_STATE = "final_state"


def gated_delta_rule(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    beta: np.ndarray,
    state: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Run the recurrence over axis 1. In: the arrays in the module layouts. Out:
    ``(o [B,T,H,V], final_state [B,H,K,V])`` in the wider of f32 and the input dtype."""
    wide = np.float64 if q.dtype == np.float64 else np.float32
    q, k, v, g, beta = (np.asarray(a, dtype=wide) for a in (q, k, v, g, beta))
    b, t, h, dk = k.shape
    dv = v.shape[-1]
    s = np.zeros((b, h, dk, dv), wide) if state is None else np.array(state, dtype=wide)
    out = np.empty((b, t, h, dv), wide)
    scale = wide(1.0 / math.sqrt(dk))
    for i in range(t):
        s *= np.exp(g[:, i])[:, :, None, None]
        kt = k[:, i]
        recalled = np.einsum("bhkv,bhk->bhv", s, kt)
        delta = (v[:, i] - recalled) * beta[:, i][:, :, None]
        s += kt[:, :, :, None] * delta[:, :, None, :]
        out[:, i] = np.einsum("bhkv,bhk->bhv", s, q[:, i]) * scale
    return out, s


@register
class GatedDeltaNet(Op):
    """Gated DeltaNet scan. Inputs ``(q, k, v, g, beta[, state])`` (``state`` iff
    ``carry``); see the module docstring for layouts and the exact recurrence."""

    mnemonic: ClassVar[str] = "gated_delta_net"
    # a reduction in the seed's precision lists: AutoMixedConservative keeps it in f32
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = (
        "gated_delta_net has no derivative rule yet (its reverse pass is a scan backward "
        "in time over the saved states); train such a block through rlx.scan of primitive ops"
    )
    state_size: int
    carry: bool = False
    returns: GdnResult = GdnResult.OUTPUT

    def num_inputs(self) -> int:
        return 6 if self.carry else 5

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        q, k, v, g, beta = ins[:5]
        expect(self.state_size > 0, self, f"state_size must be > 0, got {self.state_size}")
        for nm, s in (("q", q), ("k", k), ("v", v)):
            expect(s.rank == 4, self, f"{nm} must be [B, T, H, D], got {s}")
        for nm, s in (("g", g), ("beta", beta)):
            expect(s.rank == 3, self, f"{nm} must be [B, T, H], got {s}")
        expect(q.dtype.is_float, self, f"q must be a float tensor, got {q}")
        for nm, s in (("k", k), ("v", v), ("g", g), ("beta", beta)):
            expect(s.dtype is q.dtype, self, f"{nm} dtype {s.dtype} differs from q's {q.dtype}")
        expect(q.dims == k.dims, self, f"q {q} and k {k} must have equal shapes")
        expect(
            k.dims[3] == self.state_size,
            self,
            f"key dim of k {k} is {k.dims[3]}, expected state_size={self.state_size}",
        )
        bth = k.dims[:3]
        expect(v.dims[:3] == bth, self, f"v {v} must share [B, T, H] with k {k}")
        expect(g.dims == bth, self, f"g {g} must be [B, T, H] = {list(bth)} like k")
        expect(beta.dims == bth, self, f"beta {beta} must be [B, T, H] = {list(bth)} like k")
        b, _, h, dk = k.dims
        dv = v.dims[3]
        state_dims = (b, h, dk, dv)
        if self.carry:
            st = ins[5]
            expect(
                st.dims == state_dims and st.dtype is q.dtype,
                self,
                f"state must be [B, H, K, V] = {q.dtype}[{','.join(map(str, state_dims))}], "
                f"got {st}",
            )
        if self.returns is GdnResult.FINAL_STATE:
            return Shape(state_dims, q.dtype)
        return Shape(v.dims, q.dtype)

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        state = xs[5] if self.carry else None
        q, k, v, g, beta = xs[:5]
        out, final = gated_delta_rule(q, k, v, g, beta, state=state)
        res = final if self.returns is GdnResult.FINAL_STATE else out
        return res.astype(ctx.out_dtype)


@graph_method
def gated_delta_net(
    graph: Graph,
    q: NodeId,
    k: NodeId,
    v: NodeId,
    g: NodeId,
    beta: NodeId,
    state: NodeId | None = None,
    state_size: int | None = None,
    returns: GdnResult = GdnResult.OUTPUT,
) -> NodeId:
    """Gated delta rule over ``(q, k, v, g, beta)`` starting from ``state`` (zero when
    None). ``state_size`` defaults to k's last dim. Returns the output or the final state."""
    if state_size is None:
        kd = graph.shape(k).dims
        state_size = int(kd[-1]) if kd and isinstance(kd[-1], int) else 0
    op = GatedDeltaNet(state_size, carry=state is not None, returns=returns)
    ins = [q, k, v, g, beta] + ([state] if state is not None else [])
    return graph.apply(op, ins)


# ---- selective scan (Mamba) --------------------------------------------------------------


def selective_scan_ref(
    x: np.ndarray,
    delta: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
    d: np.ndarray | None = None,
    z: np.ndarray | None = None,
    delta_bias: np.ndarray | None = None,
    delta_softplus: bool = False,
) -> np.ndarray:
    """Mamba's selective scan over axis 1 in the wider of f32 and the input dtype.

    In: ``x``, ``delta``, ``z`` ``[B, S, H]``; ``a`` ``[H, N]``; ``b``, ``c`` ``[B, S, N]``;
    ``d``, ``delta_bias`` ``[H]``. Out: ``y [B, S, H]`` (see :class:`SelectiveScan`)."""
    wide = np.float64 if x.dtype == np.float64 else np.float32
    x, delta, a, b, c = (np.asarray(t, dtype=wide) for t in (x, delta, a, b, c))
    if delta_bias is not None:
        delta = delta + np.asarray(delta_bias, dtype=wide)
    if delta_softplus:
        delta = np.logaddexp(delta, wide(0))
    bs, s, h = x.shape
    n = a.shape[1]
    state = np.zeros((bs, h, n), wide)
    y = np.empty((bs, s, h), wide)
    for t in range(s):
        dt = delta[:, t, :, None]  # [B, H, 1]
        state = np.exp(dt * a) * state + dt * b[:, t, None, :] * x[:, t, :, None]
        y[:, t] = np.einsum("bhn,bn->bh", state, c[:, t])
    if d is not None:
        y = y + x * np.asarray(d, dtype=wide)
    if z is not None:
        zz = np.asarray(z, dtype=wide)
        y = y * (zz / (1 + np.exp(-zz)))
    return y


@register
class SelectiveScan(Op):
    """Mamba's selective scan (the seed's ``SelectiveScan``, ``mamba_ssm``'s
    ``selective_scan_ref`` with a real ``A`` and ``B``/``C`` shared by every channel).

    Inputs ``(x, delta, a, b, c[, d][, z][, delta_bias])``, the optional ones present when
    ``has_d`` / ``has_z`` / ``has_delta_bias``: ``x``, ``delta``, ``z`` ``[B, S, H]``
    (batch, sequence, channels); ``a`` ``[H, N]`` (``N = state_size``); ``b``, ``c``
    ``[B, S, N]``; ``d``, ``delta_bias`` ``[H]``. With ``dt = delta (+ delta_bias)``, then
    ``softplus(dt)`` when ``delta_softplus``, and a state ``h [B, H, N]`` starting at zero::

        h_t = exp(dt_t * a) * h_{t-1} + dt_t * b_t * x_t      (per channel and state)
        y_t = sum_n c_t[n] * h_t[:, n]  (+ d * x_t)  (* silu(z_t))

    Output ``y [B, S, H]`` in x's dtype (f16/bf16 computed in f32)."""

    mnemonic: ClassVar[str] = "selective_scan"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = (
        "selective_scan has no derivative rule yet (its reverse pass is a scan backward in "
        "time over the saved states); train such a block through rlx.scan of primitive ops"
    )
    state_size: int
    has_d: bool = False
    has_z: bool = False
    has_delta_bias: bool = False
    delta_softplus: bool = False

    def num_inputs(self) -> int:
        return 5 + self.has_d + self.has_z + self.has_delta_bias

    def optional_inputs(self, xs: Sequence[object]) -> tuple[object, object, object]:
        """``(d, z, delta_bias)`` from the input list, None where absent."""
        rest = iter(xs[5:])
        d = next(rest) if self.has_d else None
        z = next(rest) if self.has_z else None
        bias = next(rest) if self.has_delta_bias else None
        return d, z, bias

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x, delta, a, b, c = ins[:5]
        n = self.state_size
        expect(isinstance(n, int) and n > 0, self, f"state_size must be > 0, got {n}")
        expect(x.dtype.is_float and x.rank == 3, self, f"x must be a float [B, S, H], got {x}")
        d, z, bias = self.optional_inputs(ins)
        named = [("delta", delta), ("a", a), ("b", b), ("c", c)]
        named += [(nm, s) for nm, s in (("d", d), ("z", z), ("delta_bias", bias)) if s]
        for nm, s in named:
            expect(s.dtype is x.dtype, self, f"{nm} {s} must have x's dtype {x.dtype}")  # type: ignore[union-attr]
        bsz, seq, h = x.dims
        expect(delta.dims == x.dims, self, f"delta {delta} must be [B, S, H] like x {x}")
        expect(a.dims == (h, n), self, f"a must be [H, N] = [{h}, {n}], got {a}")
        for nm, s in (("b", b), ("c", c)):
            expect(
                s.dims == (bsz, seq, n),
                self,
                f"{nm} must be [B, S, N] = [{bsz},{seq},{n}], got {s}",
            )
        if z is not None:
            expect(z.dims == x.dims, self, f"z {z} must be [B, S, H] like x {x}")  # type: ignore[attr-defined]
        for nm, s in (("d", d), ("delta_bias", bias)):
            if s is not None:
                expect(s.dims == (h,), self, f"{nm} must be [H] = [{h}], got {s}")  # type: ignore[attr-defined]
        return x

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        d, z, bias = self.optional_inputs(xs)
        y = selective_scan_ref(*xs[:5], d, z, bias, self.delta_softplus)  # type: ignore[arg-type]
        return y.astype(ctx.out_dtype)


@graph_method
def selective_scan(
    graph: Graph,
    x: NodeId,
    delta: NodeId,
    a: NodeId,
    b: NodeId,
    c: NodeId,
    d: NodeId | None = None,
    z: NodeId | None = None,
    delta_bias: NodeId | None = None,
    delta_softplus: bool = False,
) -> NodeId:
    """Mamba selective scan ``y [B, S, H]`` (see :class:`SelectiveScan`); the state size
    is a's last dim."""
    ad = graph.shape(a).dims
    n = int(ad[-1]) if len(ad) == 2 and isinstance(ad[-1], int) else 0
    opt = [t for t in (d, z, delta_bias) if t is not None]
    op = SelectiveScan(n, d is not None, z is not None, delta_bias is not None, delta_softplus)
    return graph.apply(op, [x, delta, a, b, c, *opt])
