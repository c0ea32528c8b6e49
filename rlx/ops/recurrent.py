"""Recurrent ops: the gated delta rule of Gated DeltaNet (Yang et al. 2024, the linear
attention layers of Qwen3-Next).

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
from typing import ClassVar

import numpy as np

from rlx.ir.mir import Graph, NodeId
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Shape

__all__ = ["GatedDeltaNet", "GdnResult", "gated_delta_rule"]


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
