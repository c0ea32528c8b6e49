"""The peer benchmark's workloads, and each one re-implemented for PyTorch, ONNX and JAX.

In: nothing but sizes and a seed. Out: a :class:`Workload` (an rlx MIR graph, its params
from :func:`rlx.models.synthetic.random_params`, its inputs) and, for each peer, a
function of the SAME param dict:

* :func:`torch_forward` -> ``f(x: torch.Tensor) -> torch.Tensor`` (eager; wrap it in
  ``torch.compile`` for the compiled peer);
* :func:`onnx_model` -> an ``onnx.ModelProto`` built with ``onnx.helper``, the weights
  stored as initializers (run it with onnxruntime);
* :func:`jax_forward` -> ``(f(params, x), params)`` with ``params`` a dict of jnp arrays
  (wrap ``f`` in ``jax.jit``).

The workloads:

* ``mlp``: ``gelu(x @ fc1.weight + fc1.bias) @ fc2.weight + fc2.bias``, x f32[32, 1024],
  hidden 4096 (erf gelu);
* ``encoder``: :func:`rlx.models.synthetic.encoder` (MiniLM sizes by default), mirrored
  op for op: per layer q/k/v linear with bias, attention spelled out as
  ``softmax((q k^T) * 1/sqrt(hd)) v``, ``x = layer_norm(x + o(attn))``,
  ``x = layer_norm(x + down(gelu(up(x))))`` (post-norm, eps 1e-12, erf gelu);
* ``chain``: 100 tiny elementwise ops on f32[16, 64] (:data:`CHAIN`: add 0.5, mul 0.75,
  tanh, exp, repeated), i.e. dispatch overhead.

torch, onnx and jax are imported inside the functions that need them: the peers are an
optional extra (``pip install rlx[peers]``) and the parity test needs only torch.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import InputError
from rlx.ir.mir import Graph
from rlx.models.synthetic import encoder, random_inputs, random_params

if TYPE_CHECKING:
    import onnx
    import torch

__all__ = [
    "CHAIN",
    "ChainStep",
    "EncoderConfig",
    "MlpConfig",
    "Workload",
    "WorkloadKind",
    "chain_workload",
    "encoder_workload",
    "jax_forward",
    "mlp_workload",
    "onnx_model",
    "torch_forward",
    "WORKLOADS",
]


class WorkloadKind(enum.Enum):
    MLP = "mlp"
    ENCODER = "encoder"
    CHAIN = "chain"


class ChainStep(enum.Enum):
    """One op of the elementwise chain; ADD and MUL take :attr:`constant`."""

    ADD = "add"
    MUL = "mul"
    TANH = "tanh"
    EXP = "exp"

    @property
    def constant(self) -> float:
        return {ChainStep.ADD: 0.5, ChainStep.MUL: 0.75}.get(self, 0.0)


# 25 x (add, mul, tanh, exp) = 100 ops; values stay in [-1, e].
CHAIN: tuple[ChainStep, ...] = (ChainStep.ADD, ChainStep.MUL, ChainStep.TANH, ChainStep.EXP) * 25
CHAIN_SHAPE: tuple[int, int] = (16, 64)


@dataclass(frozen=True)
class MlpConfig:
    batch: int = 32
    d_in: int = 1024
    hidden: int = 4096
    d_out: int = 1024


@dataclass(frozen=True)
class EncoderConfig:
    """The arguments given to :func:`rlx.models.synthetic.encoder` (its defaults)."""

    layers: int = 6
    hidden: int = 384
    heads: int = 12
    ffn: int = 1536
    seq: int = 128
    batch: int = 1
    eps: float = 1e-12

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


@dataclass(frozen=True)
class Workload:
    """A graph with one input ``x`` and one output, its params and its input value."""

    kind: WorkloadKind
    title: str
    graph: Graph
    params: Mapping[str, np.ndarray]
    x: np.ndarray
    config: MlpConfig | EncoderConfig | tuple[ChainStep, ...]


def mlp_graph(cfg: MlpConfig) -> Graph:
    """``gelu(x @ fc1 + b1) @ fc2 + b2`` as an rlx MIR graph with input ``x``."""
    g = Graph("peers_mlp")
    x = g.input("x", (cfg.batch, cfg.d_in))
    h = g.linear(
        x, g.param("fc1.weight", (cfg.d_in, cfg.hidden)), g.param("fc1.bias", (cfg.hidden,))
    )
    h = g.gelu(h)
    y = g.linear(
        h, g.param("fc2.weight", (cfg.hidden, cfg.d_out)), g.param("fc2.bias", (cfg.d_out,))
    )
    g.set_outputs([y])
    return g


def chain_graph(steps: tuple[ChainStep, ...], shape: tuple[int, ...] = CHAIN_SHAPE) -> Graph:
    """The elementwise chain ``steps`` applied to input ``x`` of ``shape``."""
    g = Graph(f"peers_chain{len(steps)}")
    y = g.input("x", shape)
    for s in steps:
        if s is ChainStep.ADD:
            y = g.add(y, s.constant)
        elif s is ChainStep.MUL:
            y = g.mul(y, s.constant)
        elif s is ChainStep.TANH:
            y = g.tanh(y)
        else:
            y = g.exp(y)
    g.set_outputs([y])
    return g


def _seeded(
    kind: WorkloadKind, title: str, g: Graph, seed: int, cfg: MlpConfig | EncoderConfig
) -> Workload:
    """A workload with params drawn from ``seed`` and the input ``x`` from ``seed + 1``."""
    return Workload(
        kind, title, g, random_params(g, seed), random_inputs(g, seed=seed + 1)["x"], cfg
    )


def mlp_workload(cfg: MlpConfig | None = None, seed: int = 0) -> Workload:
    """The MLP workload at ``cfg`` (default :class:`MlpConfig`), params/input from ``seed``."""
    cfg = cfg or MlpConfig()
    g = mlp_graph(cfg)
    title = f"MLP (batch {cfg.batch}, {cfg.d_in} -> {cfg.hidden} -> {cfg.d_out}, gelu)"
    return _seeded(WorkloadKind.MLP, title, g, seed, cfg)


def encoder_workload(cfg: EncoderConfig | None = None, seed: int = 0) -> Workload:
    """The synthetic encoder at ``cfg`` (default: MiniLM sizes), params/input from ``seed``."""
    cfg = cfg or EncoderConfig()
    g = encoder(cfg.layers, cfg.hidden, cfg.heads, cfg.ffn, cfg.seq, cfg.batch, eps=cfg.eps)
    title = (
        f"MiniLM-sized encoder (layers {cfg.layers}, hidden {cfg.hidden}, heads {cfg.heads}, "
        f"ffn {cfg.ffn}, seq {cfg.seq}, batch {cfg.batch})"
    )
    return _seeded(WorkloadKind.ENCODER, title, g, seed, cfg)


def chain_workload(steps: tuple[ChainStep, ...] = CHAIN, seed: int = 0) -> Workload:
    """The elementwise chain ``steps`` on f32[16, 64]; the input from ``seed``."""
    g = chain_graph(steps)
    title = f"{len(steps)}-op elementwise chain on f32{list(CHAIN_SHAPE)} (add, mul, tanh, exp)"
    return Workload(WorkloadKind.CHAIN, title, g, {}, random_inputs(g, seed=seed + 1)["x"], steps)


WORKLOADS: dict[WorkloadKind, Callable[[], Workload]] = {
    WorkloadKind.MLP: mlp_workload,
    WorkloadKind.ENCODER: encoder_workload,
    WorkloadKind.CHAIN: chain_workload,
}


def _check_params(w: Workload, names: list[str]) -> None:
    missing = [n for n in names if n not in w.params]
    if missing:
        raise InputError(
            f"workload {w.kind.value}: params {missing} missing; given {sorted(w.params)}"
        )


def _encoder_param_names(cfg: EncoderConfig) -> list[str]:
    names = []
    for i in range(cfg.layers):
        for lin in ("attn.q", "attn.k", "attn.v", "attn.o", "ffn.up", "ffn.down"):
            names += [f"layer{i}.{lin}.weight", f"layer{i}.{lin}.bias"]
        for ln in ("ln1", "ln2"):
            names += [f"layer{i}.{ln}.gamma", f"layer{i}.{ln}.beta"]
    return names


# ---- PyTorch -------------------------------------------------------------------------


def torch_forward(w: Workload) -> Callable[[torch.Tensor], torch.Tensor]:
    """``w`` as a PyTorch function of ``x`` (params are the same arrays, as tensors)."""
    import torch
    import torch.nn.functional as F

    p = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in w.params.items()}
    cfg = w.config
    if w.kind is WorkloadKind.MLP:
        _check_params(w, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])

        def mlp(x: torch.Tensor) -> torch.Tensor:
            h = F.gelu(x @ p["fc1.weight"] + p["fc1.bias"])
            return h @ p["fc2.weight"] + p["fc2.bias"]

        return mlp
    if w.kind is WorkloadKind.CHAIN:
        steps = tuple(cfg)  # type: ignore[arg-type]

        def chain(x: torch.Tensor) -> torch.Tensor:
            for s in steps:
                if s is ChainStep.ADD:
                    x = x + s.constant
                elif s is ChainStep.MUL:
                    x = x * s.constant
                elif s is ChainStep.TANH:
                    x = torch.tanh(x)
                else:
                    x = torch.exp(x)
            return x

        return chain
    assert isinstance(cfg, EncoderConfig)
    _check_params(w, _encoder_param_names(cfg))
    B, S, H, D, hd = cfg.batch, cfg.seq, cfg.heads, cfg.hidden, cfg.head_dim
    scale = 1.0 / math.sqrt(hd)

    def lin(x: torch.Tensor, name: str) -> torch.Tensor:
        return x @ p[f"{name}.weight"] + p[f"{name}.bias"]

    def ln(x: torch.Tensor, name: str) -> torch.Tensor:
        return F.layer_norm(x, (D,), p[f"{name}.gamma"], p[f"{name}.beta"], cfg.eps)

    def enc(x: torch.Tensor) -> torch.Tensor:
        for i in range(cfg.layers):
            pre = f"layer{i}"
            q = lin(x, f"{pre}.attn.q").reshape(B, S, H, hd).transpose(1, 2)
            k = lin(x, f"{pre}.attn.k").reshape(B, S, H, hd).transpose(1, 2)
            v = lin(x, f"{pre}.attn.v").reshape(B, S, H, hd).transpose(1, 2)
            # q @ k.transpose(-2, -1), not q @ k.permute(0, 2, 3, 1): torch 2.13's inductor
            # rewrites the permute spelling into a mis-shaped SDPA and fails to compile.
            a = torch.softmax((q @ k.transpose(-2, -1)) * scale, dim=-1) @ v
            a = a.transpose(1, 2).reshape(B, S, D)
            x = ln(x + lin(a, f"{pre}.attn.o"), f"{pre}.ln1")
            h = F.gelu(lin(x, f"{pre}.ffn.up"))
            x = ln(x + lin(h, f"{pre}.ffn.down"), f"{pre}.ln2")
        return x

    return enc


# ---- JAX -----------------------------------------------------------------------------


def jax_forward(w: Workload) -> tuple[Callable[[Any, Any], Any], dict[str, Any]]:
    """``w`` as a pure JAX function ``f(params, x)`` plus the params as jnp arrays."""
    import jax
    import jax.numpy as jnp

    p = {k: jnp.asarray(v) for k, v in w.params.items()}
    cfg = w.config
    if w.kind is WorkloadKind.MLP:
        _check_params(w, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])

        def mlp(p: dict[str, Any], x: Any) -> Any:
            h = jax.nn.gelu(x @ p["fc1.weight"] + p["fc1.bias"], approximate=False)
            return h @ p["fc2.weight"] + p["fc2.bias"]

        return mlp, p
    if w.kind is WorkloadKind.CHAIN:
        steps = tuple(cfg)  # type: ignore[arg-type]

        def chain(p: dict[str, Any], x: Any) -> Any:
            for s in steps:
                if s is ChainStep.ADD:
                    x = x + jnp.float32(s.constant)
                elif s is ChainStep.MUL:
                    x = x * jnp.float32(s.constant)
                elif s is ChainStep.TANH:
                    x = jnp.tanh(x)
                else:
                    x = jnp.exp(x)
            return x

        return chain, p
    assert isinstance(cfg, EncoderConfig)
    _check_params(w, _encoder_param_names(cfg))
    B, S, H, D, hd = cfg.batch, cfg.seq, cfg.heads, cfg.hidden, cfg.head_dim
    scale = jnp.float32(1.0 / math.sqrt(hd))
    eps = jnp.float32(cfg.eps)

    def lin(p: dict[str, Any], x: Any, name: str) -> Any:
        return x @ p[f"{name}.weight"] + p[f"{name}.bias"]

    def ln(p: dict[str, Any], x: Any, name: str) -> Any:
        mean = jnp.mean(x, axis=-1, keepdims=True)
        c = x - mean
        var = jnp.mean(c * c, axis=-1, keepdims=True)
        return c / jnp.sqrt(var + eps) * p[f"{name}.gamma"] + p[f"{name}.beta"]

    def enc(p: dict[str, Any], x: Any) -> Any:
        for i in range(cfg.layers):
            pre = f"layer{i}"
            q = lin(p, x, f"{pre}.attn.q").reshape(B, S, H, hd).transpose(0, 2, 1, 3)
            k = lin(p, x, f"{pre}.attn.k").reshape(B, S, H, hd).transpose(0, 2, 3, 1)
            v = lin(p, x, f"{pre}.attn.v").reshape(B, S, H, hd).transpose(0, 2, 1, 3)
            a = jax.nn.softmax((q @ k) * scale, axis=-1) @ v
            a = a.transpose(0, 2, 1, 3).reshape(B, S, D)
            x = ln(p, x + lin(p, a, f"{pre}.attn.o"), f"{pre}.ln1")
            h = jax.nn.gelu(lin(p, x, f"{pre}.ffn.up"), approximate=False)
            x = ln(p, x + lin(p, h, f"{pre}.ffn.down"), f"{pre}.ln2")
        return x

    return enc, p


# ---- ONNX ----------------------------------------------------------------------------

ONNX_OPSET = 17  # LayerNormalization is opset 17
ONNX_IR_VERSION = 8  # the IR version of opset 17; onnxruntime reads it


class _OnnxBuilder:
    """Collects nodes and initializers; :meth:`op` returns the new value's name."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self._n = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def scalar(self, value: float) -> str:
        self._n += 1
        return self.const(f"c{self._n}", np.asarray(value, np.float32))

    def op(self, op_type: str, *ins: str, **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}{self._n}"
        self.nodes.append(
            self.helper.make_node(op_type, list(ins), [out], name=f"n{self._n}", **attrs)
        )
        return out

    def model(
        self, name: str, x_shape: tuple[int, ...], y: str, y_shape: tuple[int, ...]
    ) -> onnx.ModelProto:
        from onnx import TensorProto

        h = self.helper
        self.nodes.append(h.make_node("Identity", [y], ["y"], name="output"))
        graph = h.make_graph(
            self.nodes,
            name,
            [h.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
            [h.make_tensor_value_info("y", TensorProto.FLOAT, list(y_shape))],
            self.inits,
        )
        m = h.make_model(
            graph, opset_imports=[h.make_opsetid("", ONNX_OPSET)], producer_name="rlx-peers"
        )
        m.ir_version = ONNX_IR_VERSION
        return m


def onnx_model(w: Workload) -> onnx.ModelProto:
    """``w`` as an ONNX model (input ``x``, output ``y``), weights as initializers. GELU is
    spelled ``0.5 x (1 + erf(x / sqrt 2))``, which onnxruntime fuses back into one op."""
    import onnx

    b = _OnnxBuilder()
    for k, v in w.params.items():
        b.const(k, v)

    def gelu(x: str) -> str:
        e = b.op("Erf", b.op("Div", x, b.scalar(math.sqrt(2.0))))
        return b.op("Mul", b.op("Mul", x, b.scalar(0.5)), b.op("Add", e, b.scalar(1.0)))

    def lin(x: str, name: str) -> str:
        return b.op("Add", b.op("MatMul", x, f"{name}.weight"), f"{name}.bias")

    cfg = w.config
    if w.kind is WorkloadKind.MLP:
        assert isinstance(cfg, MlpConfig)
        _check_params(w, ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"])
        y = lin(gelu(lin("x", "fc1")), "fc2")
        m = b.model("peers_mlp", w.x.shape, y, (cfg.batch, cfg.d_out))
    elif w.kind is WorkloadKind.CHAIN:
        y = "x"
        for s in tuple(cfg):  # type: ignore[arg-type]
            if s is ChainStep.ADD:
                y = b.op("Add", y, b.scalar(s.constant))
            elif s is ChainStep.MUL:
                y = b.op("Mul", y, b.scalar(s.constant))
            else:
                y = b.op("Tanh" if s is ChainStep.TANH else "Exp", y)
        m = b.model("peers_chain", w.x.shape, y, w.x.shape)
    else:
        assert isinstance(cfg, EncoderConfig)
        _check_params(w, _encoder_param_names(cfg))
        B, S, H, D, hd = cfg.batch, cfg.seq, cfg.heads, cfg.hidden, cfg.head_dim
        heads_shape = b.const("shape_heads", np.asarray([B, S, H, hd], np.int64))
        flat_shape = b.const("shape_flat", np.asarray([B, S, D], np.int64))
        scale = b.scalar(1.0 / math.sqrt(hd))
        x = "x"
        for i in range(cfg.layers):
            pre = f"layer{i}"

            def heads(name: str, perm: list[int], x: str = x, pre: str = pre) -> str:
                return b.op(
                    "Transpose",
                    b.op("Reshape", lin(x, f"{pre}.attn.{name}"), heads_shape),
                    perm=perm,
                )

            q, k, v = heads("q", [0, 2, 1, 3]), heads("k", [0, 2, 3, 1]), heads("v", [0, 2, 1, 3])
            s = b.op("Mul", b.op("MatMul", q, k), scale)
            a = b.op("MatMul", b.op("Softmax", s, axis=-1), v)
            a = b.op("Reshape", b.op("Transpose", a, perm=[0, 2, 1, 3]), flat_shape)

            def ln(x: str, name: str) -> str:
                return b.op(
                    "LayerNormalization",
                    x,
                    f"{name}.gamma",
                    f"{name}.beta",
                    axis=-1,
                    epsilon=cfg.eps,
                )

            x = ln(b.op("Add", x, lin(a, f"{pre}.attn.o")), f"{pre}.ln1")
            h = gelu(lin(x, f"{pre}.ffn.up"))
            x = ln(b.op("Add", x, lin(h, f"{pre}.ffn.down")), f"{pre}.ln2")
        m = b.model("peers_encoder", w.x.shape, x, (B, S, D))
    onnx.checker.check_model(m)
    return m
