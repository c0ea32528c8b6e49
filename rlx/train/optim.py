"""Optimizers as graph builders. In: the step graph being built, one trainable param and
its gradient (node ids), the learning-rate node and the step-number node. Out: the node of
the param's new value, plus state params (``adam.m.<name>``...) and their new values,
which the training step writes back with ``assign`` (``rlx/ops/state.py``). When the
step graph is compiled for the CPU backend (``UpdateCtx.fused``) :class:`Adam` and
:class:`AdamW` instead emit one ``adam_update`` node per param, which writes the new param
and its ``m``, ``v`` in place in one native pass, and :meth:`Optimizer.update` returns None
(``fused=False`` on the optimizer keeps the graph-and-assign path).

Each optimizer follows ``torch.optim``'s single-tensor update of the same name, in the
same order of operations (tests/train/test_optim.py checks them to 1e-6 over several
steps): :class:`SGD` (momentum, Nesterov, L2 weight decay), :class:`Adam` (L2 weight
decay added to the gradient) and :class:`AdamW` (decoupled weight decay). The scalar
factors (``1 - beta**t``, ``lr / bias_correction``) are computed in f64 from the f64
learning-rate input and step counter, then rounded once to the param's dtype, as
PyTorch does with its Python floats. :func:`clip_by_global_norm` is
``torch.nn.utils.clip_grad_norm_`` in the graph.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ir.mir import Graph, NodeId

__all__ = ["Optimizer", "SGD", "Adam", "AdamW", "UpdateCtx", "clip_by_global_norm"]


@dataclass
class UpdateCtx:
    """What an optimizer's :meth:`Optimizer.update` builds with: the graph ``g``, the
    f64 rank-0 learning rate ``lr`` and 1-based step number ``step`` of this update, and
    the state params it made (name -> (node, its new value))."""

    g: Graph
    lr: NodeId
    step: NodeId
    fused: bool = False
    writes: dict[str, tuple[NodeId, NodeId]] = field(default_factory=dict)
    #: state params updated in place by a fused update node (name -> node)
    inplace: dict[str, NodeId] = field(default_factory=dict)

    def state(self, kind: str, name: str, like: NodeId) -> NodeId:
        """A new state param ``<kind>.<name>`` of ``like``'s shape and dtype (starts at
        zero)."""
        return self.g.param(f"{kind}.{name}", self.g.shape(like))

    def write(self, state: NodeId, value: NodeId) -> None:
        """Record ``value`` as the new value of state param ``state``."""
        name = self.g.nodes[state].op.name  # type: ignore[attr-defined]
        self.writes[name] = (state, value)

    def factor(self, value: NodeId, like: NodeId) -> NodeId:
        """The f64 scalar ``value`` rounded once to ``like``'s dtype."""
        dt = self.g.shape(like).dtype
        return value if dt is DType.F64 else self.g.cast(value, dt)

    def const(self, value: float) -> NodeId:
        """An f64 rank-0 constant."""
        return self.g.constant(np.float64(value))


def _check(what: str, value: float, lo: float, hi: float | None = None) -> float:
    v = float(value)
    if not (v >= lo and (hi is None or v < hi)) or not np.isfinite(v):
        span = f"[{lo}, {hi})" if hi is not None else f">= {lo}"
        raise InputError(f"{what} must be {span}, given {value!r}")
    return v


class Optimizer:
    """Base of the optimizers: ``lr`` (the learning rate when no schedule gives one) and
    :meth:`update`, which emits one param's update into the step graph."""

    #: prefix of the state param names (``<prefix>.m.<param>``)
    prefix = "opt"
    lr: float

    def update(self, ctx: UpdateCtx, name: str, p: NodeId, grad: NodeId) -> NodeId | None:
        """The node of param ``name``'s new value, given its node ``p`` and gradient (None:
        the update node written into ``ctx.g`` updates the param in place)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        attrs = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({attrs})"


class SGD(Optimizer):
    """``torch.optim.SGD``: ``d = grad + weight_decay * p``; with momentum
    ``buf = momentum * buf + d`` and ``d = d + momentum * buf`` (Nesterov) or ``d = buf``;
    ``p -= lr * d``. State: ``sgd.buf.<name>`` when momentum is used."""

    prefix = "sgd"

    def __init__(
        self,
        lr: float = 1e-2,
        *,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ):
        self.lr = _check("SGD lr", lr, 0.0)
        self.momentum = _check("SGD momentum", momentum, 0.0)
        self.weight_decay = _check("SGD weight_decay", weight_decay, 0.0)
        if nesterov and self.momentum == 0.0:
            raise InputError("SGD: nesterov needs a momentum > 0")
        self.nesterov = bool(nesterov)

    def update(self, ctx: UpdateCtx, name: str, p: NodeId, grad: NodeId) -> NodeId:
        g = ctx.g
        d = grad
        if self.weight_decay:
            d = g.add(d, g.mul(p, _f(g, self.weight_decay, p)))
        if self.momentum:
            buf = ctx.state(f"{self.prefix}.buf", name, p)
            new_buf = g.add(g.mul(buf, _f(g, self.momentum, p)), d)
            ctx.write(buf, new_buf)
            d = g.add(d, g.mul(new_buf, _f(g, self.momentum, p))) if self.nesterov else new_buf
        return g.sub(p, g.mul(d, ctx.factor(ctx.lr, p)))


class Adam(Optimizer):
    """``torch.optim.Adam``: with ``grad += weight_decay * p`` (L2), ``m = lerp(m, grad,
    1 - beta1)``, ``v = beta2 * v + (1 - beta2) * grad**2``, ``p -= lr / (1 - beta1**t) *
    m / (sqrt(v) / sqrt(1 - beta2**t) + eps)``. State: ``adam.m.<name>``,
    ``adam.v.<name>``."""

    prefix = "adam"
    decoupled = False

    def __init__(
        self,
        lr: float = 1e-3,
        *,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool = True,
    ):
        name = type(self).__name__
        self.fused = bool(fused)
        self.lr = _check(f"{name} lr", lr, 0.0)
        if len(betas) != 2:
            raise InputError(f"{name} betas must be two floats, given {betas!r}")
        self.betas = (
            _check(f"{name} beta1", betas[0], 0.0, 1.0),
            _check(f"{name} beta2", betas[1], 0.0, 1.0),
        )
        self.eps = _check(f"{name} eps", eps, 0.0)
        self.weight_decay = _check(f"{name} weight_decay", weight_decay, 0.0)

    def update(self, ctx: UpdateCtx, name: str, p: NodeId, grad: NodeId) -> NodeId | None:
        g = ctx.g
        b1, b2 = self.betas
        if ctx.fused and self.fused:
            m = ctx.state(f"{self.prefix}.m", name, p)
            v = ctx.state(f"{self.prefix}.v", name, p)
            for s in (m, v):
                ctx.inplace[g.nodes[s].op.name] = s  # type: ignore[attr-defined]
            g.adam_update(
                p,
                grad,
                m,
                v,
                ctx.lr,
                ctx.step,
                beta1=b1,
                beta2=b2,
                eps=self.eps,
                weight_decay=self.weight_decay,
                decoupled=self.decoupled,
            )
            return None
        if self.weight_decay and self.decoupled:  # AdamW: p *= 1 - lr * wd, first
            keep = g.sub(ctx.const(1.0), g.mul(ctx.lr, ctx.const(self.weight_decay)))
            p = g.mul(p, ctx.factor(keep, p))
        elif self.weight_decay:
            grad = g.add(grad, g.mul(p, _f(g, self.weight_decay, p)))
        m = ctx.state(f"{self.prefix}.m", name, p)
        v = ctx.state(f"{self.prefix}.v", name, p)
        m_new = g.add(m, g.mul(g.sub(grad, m), _f(g, 1.0 - b1, p)))
        v_new = g.add(g.mul(v, _f(g, b2, p)), g.mul(g.mul(grad, grad), _f(g, 1.0 - b2, p)))
        ctx.write(m, m_new)
        ctx.write(v, v_new)
        bc1 = g.sub(ctx.const(1.0), g.pow(ctx.const(b1), ctx.step))
        bc2 = g.sub(ctx.const(1.0), g.pow(ctx.const(b2), ctx.step))
        step_size = ctx.factor(g.div(ctx.lr, bc1), p)
        denom = g.add(g.div(g.sqrt(v_new), ctx.factor(g.sqrt(bc2), p)), _f(g, self.eps, p))
        return g.sub(p, g.mul(g.div(m_new, denom), step_size))


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled weight decay, ``p *= 1 - lr *
    weight_decay`` before the Adam step (default ``weight_decay=0.01``). State:
    ``adamw.m.<name>``, ``adamw.v.<name>``."""

    prefix = "adamw"
    decoupled = True

    def __init__(
        self,
        lr: float = 1e-3,
        *,
        betas: Sequence[float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        fused: bool = True,
    ):
        super().__init__(lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=fused)


def _f(g: Graph, value: float, like: NodeId) -> NodeId:
    """A rank-0 constant ``value`` in ``like``'s dtype."""
    return g.constant(np.asarray(value, dtype=g.shape(like).dtype.np))


def clip_by_global_norm(
    g: Graph, grads: Sequence[NodeId], max_norm: float
) -> tuple[list[NodeId], NodeId]:
    """``torch.nn.utils.clip_grad_norm_``: the grads scaled by ``min(1, max_norm /
    (norm + 1e-6))`` where ``norm`` is the 2-norm of all of them together. Returns the
    scaled grads and the norm (rank 0, the first grad's dtype)."""
    max_norm = _check("clip_norm", max_norm, 0.0)
    if not grads:
        raise InputError("clip_by_global_norm: no gradients to clip")
    like = grads[0]
    total: NodeId | None = None
    for d in grads:
        sq = g.sum(g.mul(d, d))
        if g.shape(sq).dtype is not g.shape(like).dtype:
            sq = g.cast(sq, g.shape(like).dtype)
        total = sq if total is None else g.add(total, sq)
    assert total is not None
    norm = g.sqrt(total)
    coef = g.div(_f(g, max_norm, like), g.add(norm, _f(g, 1e-6, like)))
    coef = g.minimum(coef, _f(g, 1.0, like))
    out = []
    for d in grads:
        c = coef if g.shape(d).dtype is g.shape(like).dtype else g.cast(coef, g.shape(d).dtype)
        out.append(g.mul(d, c))
    return out, norm
