"""A small byte-level decoder-only transformer built with the graph builders, and its data.

In: a :class:`CharLMConfig` (context, width, heads, layers, norm, tied head). Out:
:func:`loss_graph` (inputs ``tokens`` and ``targets``, i64 ``[batch, seq]``; output the
mean next-byte cross entropy in nats, shape ``[1]``), :func:`logits_graph` (``tokens`` ->
``[batch, seq, 256]`` logits), :func:`init_params` (seeded GPT-2 style initial weights)
and :func:`generate` (sampling from a compiled logits graph).

The network (pre-norm, GPT-2 shaped, no biases): token embedding (``gather``) + learned
position embedding (``gather`` of positions ``0..seq-1``), then per layer
``x += o(attention(norm1(x)))`` with causal multi-head attention (the ``attention`` op,
``MaskKind.causal()``) and ``x += down(gelu(up(norm2(x))))`` (exact erf GELU), a final
norm and the head: ``x @ tok_embᵀ`` when tied, else its own ``head`` weight. ``norm`` is
``"rms"`` (``rms_norm``, gain only) or ``"layer"`` (``layer_norm`` with gain and bias).
Linear weights are params ``[in, out]``.

Data: :func:`stdlib_corpus` reads the running interpreter's standard library
(``sysconfig.get_paths()["stdlib"]``) ``.py`` files as bytes (sorted paths, so the same
interpreter gives the same text) and splits it by file: a file is validation when the
hash of its relative path falls in the first ``val_fraction`` of the hash range (so the
split does not move when files are added or removed); test packages and site-packages are
left out. :func:`batches_from_stdlib` draws ``(tokens, targets)`` windows from either
split with a seeded generator; the tokens are the bytes themselves (vocabulary 256).
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.dtype import DType
from rlx.errors import ModelError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.compose.losses import cross_entropy
from rlx.ops.nn import MaskKind

__all__ = [
    "CharLMConfig",
    "init_params",
    "loss_graph",
    "logits_graph",
    "stdlib_corpus",
    "batches_from_stdlib",
    "generate",
    "windows",
    "param_shapes",
    "VOCAB",
]

#: Byte-level vocabulary.
VOCAB = 256


@dataclass(frozen=True)
class CharLMConfig:
    """Shape of the model: ``context`` tokens at most, width ``dim`` split in ``heads``,
    ``layers`` blocks, FFN width ``mlp`` (default ``4 * dim``), ``norm`` "rms" or
    "layer", ``tied`` head (the token embedding transposed) or not."""

    context: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 2
    mlp: int = 0
    norm: str = "rms"
    tied: bool = True
    eps: float = 1e-5

    def __post_init__(self) -> None:
        for k in ("context", "dim", "heads", "layers"):
            v = getattr(self, k)
            if not isinstance(v, int) or v < 1:
                raise ModelError(f"CharLMConfig.{k} must be an int >= 1, got {v!r}")
        if self.dim % self.heads:
            raise ModelError(f"CharLMConfig: dim {self.dim} is not divisible by heads {self.heads}")
        if self.norm not in ("rms", "layer"):
            raise ModelError(f"CharLMConfig.norm must be 'rms' or 'layer', got {self.norm!r}")
        if self.mlp == 0:
            object.__setattr__(self, "mlp", 4 * self.dim)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


def param_shapes(cfg: CharLMConfig) -> dict[str, tuple[int, ...]]:
    """Param name -> shape, in graph order."""
    d, f = cfg.dim, cfg.mlp
    shapes: dict[str, tuple[int, ...]] = {"tok_emb": (VOCAB, d), "pos_emb": (cfg.context, d)}
    for i in range(cfg.layers):
        p = f"h{i}"
        shapes[f"{p}.norm1.g"] = (d,)
        if cfg.norm == "layer":
            shapes[f"{p}.norm1.b"] = (d,)
        for r in "qkvo":
            shapes[f"{p}.attn.{r}"] = (d, d)
        shapes[f"{p}.norm2.g"] = (d,)
        if cfg.norm == "layer":
            shapes[f"{p}.norm2.b"] = (d,)
        shapes[f"{p}.mlp.up"] = (d, f)
        shapes[f"{p}.mlp.down"] = (f, d)
    shapes["norm_f.g"] = (d,)
    if cfg.norm == "layer":
        shapes["norm_f.b"] = (d,)
    if not cfg.tied:
        shapes["head"] = (d, VOCAB)
    return shapes


def init_params(cfg: CharLMConfig, seed: int = 0, dtype: Any = np.float32) -> dict[str, np.ndarray]:
    """Seeded initial weights: normal(0, 0.02) matrices and embeddings (the residual
    outputs ``o`` and ``down`` scaled by ``1/sqrt(2 * layers)``), gains 1, biases 0."""
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".g"):
            a = np.ones(shape)
        elif name.endswith(".b"):
            a = np.zeros(shape)
        else:
            std = 0.02
            if name.endswith((".attn.o", ".mlp.down")):
                std /= np.sqrt(2 * cfg.layers)
            a = rng.normal(0.0, std, shape)
        out[name] = np.ascontiguousarray(a, dtype=dtype)
    return out


def _body(cfg: CharLMConfig, g: Graph, tokens: NodeId, dtype: DType) -> NodeId:
    """Logits ``[batch, seq, VOCAB]`` of i64 ``tokens`` ``[batch, seq]``."""
    shapes = param_shapes(cfg)

    def p(name: str) -> NodeId:
        return g.param(name, shapes[name], dtype)

    def norm(x: NodeId, name: str) -> NodeId:
        if cfg.norm == "rms":
            return g.rms_norm(x, p(f"{name}.g"), eps=cfg.eps)
        return g.layer_norm(x, p(f"{name}.g"), p(f"{name}.b"), cfg.eps)

    tok = p("tok_emb")
    ones = g.add(g.mul(tokens, np.int64(0)), np.int64(1))
    positions = g.sub(g.cumsum(ones, 1), np.int64(1))
    x = g.add(g.gather(tok, tokens, 0), g.gather(p("pos_emb"), positions, 0))
    for i in range(cfg.layers):
        h = norm(x, f"h{i}.norm1")
        q, k, v = (g.matmul(h, p(f"h{i}.attn.{r}")) for r in "qkv")
        a = g.attention(q, k, v, cfg.heads, cfg.head_dim, mask=MaskKind.causal())
        x = g.add(x, g.matmul(a, p(f"h{i}.attn.o")))
        h = norm(x, f"h{i}.norm2")
        x = g.add(x, g.matmul(g.gelu(g.matmul(h, p(f"h{i}.mlp.up"))), p(f"h{i}.mlp.down")))
    x = norm(x, "norm_f")
    head = g.transpose(tok, (1, 0)) if cfg.tied else p("head")
    return g.matmul(x, head)


def _graph(
    cfg: CharLMConfig, name: str, batch: int | None, seq: int | None
) -> tuple[Graph, tuple[Any, Any]]:
    """A new graph and its ``(batch, seq)`` dims (symbolic where None)."""
    g = Graph(name)
    b = g.sym("batch") if batch is None else batch
    s = g.sym("seq", max=cfg.context) if seq is None else seq
    if isinstance(s, int) and not 1 <= s <= cfg.context:
        raise ModelError(f"charlm: seq must be in 1..{cfg.context} (the context), got {s}")
    return g, (b, s)


def logits_graph(
    cfg: CharLMConfig, batch: int | None = None, seq: int | None = None, dtype: DType = DType.F32
) -> Graph:
    """``tokens`` i64 ``[batch, seq]`` -> logits ``[batch, seq, 256]``; ``None`` makes a
    dim symbolic (seq at most ``cfg.context``)."""
    g, dims = _graph(cfg, "charlm.logits", batch, seq)
    tokens = g.input("tokens", dims, DType.I64)
    g.set_outputs([_body(cfg, g, tokens, dtype)])
    return g.verify()


def loss_graph(
    cfg: CharLMConfig, batch: int | None = None, seq: int | None = None, dtype: DType = DType.F32
) -> Graph:
    """``tokens``, ``targets`` i64 ``[batch, seq]`` -> mean next-byte cross entropy
    (nats, ``rlx.train.cross_entropy``) of shape ``[1]``; ``None`` makes a dim symbolic."""
    g, dims = _graph(cfg, "charlm.loss", batch, seq)
    tokens = g.input("tokens", dims, DType.I64)
    targets = g.input("targets", dims, DType.I64)
    loss = cross_entropy(g, _body(cfg, g, tokens, dtype), targets)
    g.set_outputs([g.reshape(loss, (1,))])
    return g.verify()


# ---- data -------------------------------------------------------------------------------


def _is_val(rel: str, val_fraction: float) -> bool:
    h = int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little")
    return (h % 10_000) < val_fraction * 10_000


def stdlib_corpus(
    val_fraction: float = 0.05, max_bytes: int | None = None, root: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) uint8 arrays: the ``.py`` files under ``root`` (default: this
    interpreter's standard library, without ``site-packages`` and tests), split by file
    (see the module docstring); each part is cut at ``max_bytes`` when given."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ModelError(f"stdlib_corpus: {str(base)!r} is not a directory")
    if not 0.0 < val_fraction < 1.0:
        raise ModelError(f"stdlib_corpus: val_fraction must be in (0, 1), got {val_fraction}")
    parts: dict[bool, list[bytes]] = {False: [], True: []}
    size = {False: 0, True: 0}
    for path in sorted(base.rglob("*.py")):
        rel = path.relative_to(base).as_posix()
        if rel.startswith(("site-packages/", "dist-packages/")) or "/test" in f"/{rel}":
            continue
        val = _is_val(rel, val_fraction)
        if max_bytes is not None and size[val] >= max_bytes:
            if size[not val] >= max_bytes:
                break
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        parts[val].append(data)
        size[val] += len(data)
    train, val = (np.frombuffer(b"".join(parts[k]), dtype=np.uint8) for k in (False, True))
    if max_bytes is not None:
        train, val = train[:max_bytes], val[:max_bytes]
    if len(train) < 2 or len(val) < 2:
        raise ModelError(f"stdlib_corpus: found too little text under {str(base)!r}")
    return train, val


def windows(
    data: np.ndarray, context: int, batch_size: int, rng: np.random.Generator
) -> dict[str, np.ndarray]:
    """One batch of random windows of ``data``: ``tokens`` and the next bytes ``targets``
    (i64 ``[batch_size, context]``)."""
    if len(data) <= context:
        raise ModelError(f"windows: {len(data)} bytes of text is not more than context {context}")
    start = rng.integers(0, len(data) - context, size=batch_size)
    idx = start[:, None] + np.arange(context + 1)[None, :]
    chunk = data[idx].astype(np.int64)
    return {"tokens": chunk[:, :-1], "targets": chunk[:, 1:]}


def batches_from_stdlib(
    context: int,
    batch_size: int,
    split: str = "train",
    seed: int = 0,
    val_fraction: float = 0.05,
    max_bytes: int | None = None,
    corpus: tuple[np.ndarray, np.ndarray] | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """Endless batches ``{"tokens", "targets"}`` (i64 ``[batch_size, context]``) from the
    ``split`` ("train" or "val") of :func:`stdlib_corpus` (or of ``corpus``), drawn by a
    generator seeded with ``seed`` (the same seed gives the same batches)."""
    if split not in ("train", "val"):
        raise ModelError(f"batches_from_stdlib: split must be 'train' or 'val', got {split!r}")
    train, val = corpus if corpus is not None else stdlib_corpus(val_fraction, max_bytes)
    data = train if split == "train" else val
    rng = np.random.default_rng(seed)
    while True:
        yield windows(data, context, batch_size, rng)


def generate(
    run: Any,
    prompt: bytes,
    steps: int,
    context: int,
    temperature: float = 0.8,
    seed: int = 0,
) -> bytes:
    """``prompt`` followed by ``steps`` sampled bytes. ``run(tokens) -> logits`` runs a
    compiled :func:`logits_graph` on i64 ``[1, n]`` tokens (``n <= context``; the last
    ``context`` bytes are fed); ``temperature`` 0 is greedy."""
    rng = np.random.default_rng(seed)
    out = list(prompt) or [ord("\n")]
    for _ in range(steps):
        window = np.asarray(out[-context:], dtype=np.int64)[None, :]
        logits = np.asarray(run(window), dtype=np.float64)[0, -1]
        if temperature <= 0:
            nxt = int(np.argmax(logits))
        else:
            z = logits / temperature
            p = np.exp(z - z.max())
            nxt = int(rng.choice(VOCAB, p=p / p.sum()))
        out.append(nxt)
    return bytes(out)
