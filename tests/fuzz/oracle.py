"""The differential fuzzer's oracle: a float64 NumPy interpreter of a random
:class:`~tests.fuzz.programs.Program`, written here from the ops' definitions (it shares
no code with rlx's op references). In: a program and its leaf values. Out: its outputs
in float64 and the largest |value| it computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

from .programs import LN_EPS, Leaf, Program, attention_mask

__all__ = ["run"]


_erf = np.vectorize(math.erf, otypes=[np.float64])


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


ORACLE_UNARY: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "relu": lambda x: np.where(x > 0, x, 0.0),
    "neg": lambda x: -x,
    "abs": np.abs,
    "sin": np.sin,
    "cos": np.cos,
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0))),
    "silu": lambda x: x * _sigmoid(x),
    "exp_tanh": lambda x: np.exp(np.tanh(x)),
}
ORACLE_BINARY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "max": np.maximum,
    "min": np.minimum,
    "div_safe": lambda a, b: a / (np.abs(b) + 1.0),
}
ROUND = {"f16": np.float16, "bf16": ml_dtypes.bfloat16}


def run(p: Program, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], float]:
    """The outputs in float64 and the largest |value| the program computes."""
    vals: list[np.ndarray] = []
    for s in p.values:
        if isinstance(s, Leaf):
            vals.append(feeds[s.name].astype(np.float64))
            continue
        x = [vals[i] for i in s.ins]
        if s.op == "unary":
            y = ORACLE_UNARY[s.args[0]](x[0])
        elif s.op == "binary":
            y = ORACLE_BINARY[s.args[0]](x[0], x[1])
        elif s.op == "scalar":
            y = ORACLE_BINARY[s.args[0]](x[0], np.float64(s.args[1]))
        elif s.op == "matmul":
            y = np.einsum("...k,kj->...j", x[0], x[1])
        elif s.op == "softmax":
            e = np.exp(x[0] - x[0].max(axis=-1, keepdims=True))
            y = e / e.sum(axis=-1, keepdims=True)
        elif s.op == "log_softmax":
            z = x[0] - x[0].max(axis=-1, keepdims=True)
            y = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        elif s.op == "rms_norm":
            y = x[0] / np.sqrt((x[0] ** 2).mean(axis=-1, keepdims=True) + LN_EPS) * x[1]
        elif s.op == "layer_norm":
            mu = x[0].mean(axis=-1, keepdims=True)
            var = ((x[0] - mu) ** 2).mean(axis=-1, keepdims=True)
            y = (x[0] - mu) / np.sqrt(var + LN_EPS) * x[1] + x[2]
        elif s.op == "reduce":
            fn, axis, keep = s.args
            y = {"sum": np.sum, "mean": np.mean, "max": np.max}[fn](x[0], axis=axis, keepdims=keep)
        elif s.op == "transpose":
            y = x[0].T
        elif s.op == "reshape":
            y = x[0].reshape(s.args[0])
        elif s.op == "concat":
            y = np.concatenate(x, axis=s.args[0])
        elif s.op == "narrow":
            axis, start, length = s.args
            y = np.take(x[0], np.arange(start, start + length), axis=axis)
        elif s.op == "where":
            cmp, th = s.args
            cond = {"gt": np.greater, "lt": np.less, "ge": np.greater_equal}[cmp](x[0], th)
            y = np.where(cond, x[1], x[2])
        elif s.op == "attention":
            y = _oracle_attention(x[0], x[1], *s.args)
        elif s.op == "cast":  # round to the narrow type through f32, as the graph's f32
            y = x[0].astype(np.float32).astype(ROUND[s.args[0]]).astype(np.float64)
        else:  # pragma: no cover - every op of the strategy is listed above
            raise AssertionError(s.op)
        vals.append(np.asarray(y, np.float64))
    scale = max(float(np.max(np.abs(v), initial=0.0)) for v in vals)
    return [vals[i] for i in p.outputs], scale


def _oracle_attention(q: np.ndarray, kv: np.ndarray, heads: int, kind: str, seen) -> np.ndarray:
    q, kv = q[0], kv[0]
    sq, skv, d = q.shape[0], kv.shape[0], q.shape[1] // heads
    m = attention_mask(sq, skv, kind, seen)
    out = np.empty_like(q)
    for h in range(heads):
        c = slice(h * d, (h + 1) * d)
        s = q[:, c] @ kv[:, c].T / math.sqrt(d)
        if m is not None:
            s = s + m.astype(np.float64)
        e = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, c] = e / e.sum(axis=1, keepdims=True) @ kv[:, c]
    return out[None]
