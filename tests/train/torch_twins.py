"""PyTorch twins of the models the training tests differentiate: the same math written
independently with torch ops, run on the same weights, so torch autograd is the oracle.

In: a CharLMConfig and its params (rlx names, ``[in, out]`` linear weights) or a
transformers BertModel. Out: the scalar loss as a torch tensor whose ``.backward()`` gives
the reference gradients (:func:`charlm_grads`, :func:`mnrl_loss`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

from rlx.models.charlm import CharLMConfig


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside the block (the CI machine is shared: OpenMP barriers
    over a busy second core cost more than the core gives), restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def charlm_loss(
    cfg: CharLMConfig, w: Mapping[str, torch.Tensor], tokens: np.ndarray, targets: np.ndarray
) -> torch.Tensor:
    """Mean next-byte cross entropy of the char LM with weights ``w`` (torch tensors)."""
    tok = torch.as_tensor(tokens)
    b, s = tok.shape
    nh, hd = cfg.heads, cfg.head_dim

    def norm(x: torch.Tensor, name: str) -> torch.Tensor:
        if cfg.norm == "rms":
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + cfg.eps) * w[f"{name}.g"]
        return F.layer_norm(x, (cfg.dim,), w[f"{name}.g"], w[f"{name}.b"], cfg.eps)

    x = w["tok_emb"][tok] + w["pos_emb"][:s]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(cfg.layers):
        h = norm(x, f"h{i}.norm1")
        q, k, v = ((h @ w[f"h{i}.attn.{r}"]).reshape(b, s, nh, hd).transpose(1, 2) for r in "qkv")
        att = (q @ k.transpose(-1, -2)) / hd**0.5
        att = att.masked_fill(~causal, float("-inf")).softmax(-1)
        a = (att @ v).transpose(1, 2).reshape(b, s, cfg.dim)
        x = x + a @ w[f"h{i}.attn.o"]
        h = norm(x, f"h{i}.norm2")
        x = x + F.gelu(h @ w[f"h{i}.mlp.up"]) @ w[f"h{i}.mlp.down"]
    x = norm(x, "norm_f")
    logits = x @ (w["tok_emb"].T if cfg.tied else w["head"])
    return F.cross_entropy(logits.reshape(b * s, -1), torch.as_tensor(targets).reshape(-1))


def charlm_grads(
    cfg: CharLMConfig, params: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray]
) -> tuple[float, dict[str, np.ndarray]]:
    """(loss, {name: gradient}) by torch autograd in the params' dtype."""
    w = {k: torch.tensor(np.array(v), requires_grad=True) for k, v in params.items()}
    with one_thread():
        loss = charlm_loss(cfg, w, batch["tokens"], batch["targets"])
        loss.backward()
    return float(loss.detach()), {k: t.grad.numpy() for k, t in w.items()}


def mean_pool(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of the token states ``h[B,S,H]`` over the real tokens of ``mask[B,S]``."""
    m = mask.to(h.dtype).unsqueeze(-1)
    return (h * m).sum(1) / m.sum(1)


def mnrl_loss(
    model: torch.nn.Module, batch: Mapping[str, np.ndarray], scale: float
) -> torch.Tensor:
    """Multiple-negatives ranking loss of a batch whose first half are anchors and second
    half their positives: cross entropy of ``scale * cos(anchor_i, positive_j)`` rows with
    target ``j = i`` (sentence-transformers' MultipleNegativesRankingLoss)."""
    ids = torch.as_tensor(batch["input_ids"])
    mask = torch.as_tensor(batch["attention_mask"])
    kw = {"token_type_ids": torch.as_tensor(batch["token_type_ids"])}
    h = model(input_ids=ids, attention_mask=mask, **kw).last_hidden_state
    e = F.normalize(mean_pool(h, mask), dim=-1)
    n = ids.shape[0] // 2
    scores = scale * e[:n] @ e[n:].T
    return F.cross_entropy(scores, torch.arange(n))


#: (question, answer) pairs for the contrastive MiniLM tests: each answer is its
#: question's positive and the other answers are its negatives.
PAIRS = [
    ("How do I open a file in Python?", "Use the built-in open() with a mode such as 'r'."),
    ("What does a dict comprehension look like?", "{k: v for k, v in pairs} builds a dict."),
    ("How can I sort a list in reverse?", "Call sorted(xs, reverse=True) or xs.sort()."),
    ("How to read environment variables?", "os.environ maps names to values; os.getenv reads."),
    ("Which module parses command-line options?", "argparse builds command-line parsers."),
    ("How do I join paths?", "os.path.join and pathlib.Path combine path parts."),
    ("What is a generator expression?", "(x * x for x in xs) yields values lazily."),
    ("How to time a function?", "timeit measures snippets; time.perf_counter spans."),
]


def minilm_torch(path: str) -> torch.nn.Module:
    """transformers' BertModel of all-MiniLM-L6-v2 in eval mode (no dropout), eager
    attention."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(path, attn_implementation="eager").eval()


def to_rlx_layout(name: str, grad: np.ndarray) -> np.ndarray:
    """A torch gradient in rlx's param layout (linear weights are ``[in, out]``)."""
    return grad.T if grad.ndim == 2 and "embeddings." not in name else grad
