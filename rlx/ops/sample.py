"""Token sampling: the seed's ``Sample`` op (logits -> temperature -> top-k -> top-p ->
softmax -> one multinomial draw per row), with a reproducible random-number contract.

The contract (what a re-implementation must do to draw the same tokens):

* Rows are the logits' leading dims in row-major order, ``r = 0, 1, ...``.
* Row ``r`` draws one uniform ``u`` in ``[0, 1)``: the first 32-bit word of
  Philox4x32-10 (Salmon et al. 2011, the Random123 constants) with key
  ``(seed mod 2**32, seed >> 32)`` and counter ``(r mod 2**32, r >> 32, offset mod 2**32,
  (offset >> 32) mod 2**32)``, shifted right by 8 and times ``2**-24``. ``offset`` is the
  optional integer input (0 without it): a decode loop passes its step number to get a
  fresh draw per step from one compiled graph; the same (seed, offset, logits) always give
  the same tokens. (The seed's Philox uses the multiplier 0xD2561A75 where Random123 has
  0xD2511F53, so its streams are not reproduced bit for bit.)
* In f64: ``z = logits / temperature``. ``top_k > 0``: entries below the ``top_k``-th
  largest ``z`` become ``-inf`` (ties with it are kept). ``p = softmax(z)``. ``top_p < 1``:
  sort ``p`` descending (ties: smaller index first), keep the shortest prefix whose sum
  reaches ``top_p``, zero the rest. With ``c`` the running sum of ``p`` in index order,
  the token is the first ``i`` with ``c[i] > u * c[-1]``: a token of probability 0 is
  never drawn.
* ``temperature == 0`` is greedy: the index of the row's largest logit (the first on
  ties); ``u`` is not used. Logits holding NaN or +inf, or a row of only ``-inf``, are an
  InputError.

Output: int64 token ids shaped like the logits without their last dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from rlx.dtype import DType
from rlx.errors import InputError
from rlx.ops.base import Op, OpKind, RefCtx, expect, graph_method, register
from rlx.shape import Shape

if TYPE_CHECKING:
    from rlx.ir.mir import Graph, NodeId

__all__ = ["Sample", "philox_uniform"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
_LO = np.uint64(0xFFFFFFFF)
_S32 = np.uint64(32)


def philox4x32(
    ctr: Sequence[np.ndarray], key: tuple[int, int], rounds: int = 10
) -> list[np.ndarray]:
    """Philox4x32 of ``rounds`` rounds over arrays of counter words (uint64 holding 32-bit
    values); returns the four output words as uint64 arrays."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in ctr)
    k0, k1 = np.uint64(key[0]), np.uint64(key[1])
    for i in range(rounds):
        if i:
            k0 = (k0 + _W0) & _LO
            k1 = (k1 + _W1) & _LO
        p0, p1 = c0 * _M0, c2 * _M1
        c0, c1, c2, c3 = ((p1 >> _S32) ^ c1 ^ k0), p1 & _LO, ((p0 >> _S32) ^ c3 ^ k1), p0 & _LO
    return [c0, c1, c2, c3]


def philox_uniform(rows: int, seed: int, offset: int = 0) -> np.ndarray:
    """The ``rows`` uniforms of the module's contract, as f64."""
    r = np.arange(rows, dtype=np.uint64)
    off = int(offset) % 2**64
    ctr = [r & _LO, r >> _S32, np.uint64(off & 0xFFFFFFFF), np.uint64(off >> 32)]
    word = philox4x32([np.broadcast_to(c, r.shape) for c in ctr], (seed & 0xFFFFFFFF, seed >> 32))
    return (word[0] >> np.uint64(8)).astype(np.float64) * 2.0**-24


def check_rows(z: np.ndarray) -> None:
    """InputError for logits holding NaN or +inf, or a row of only ``-inf``."""
    if np.isnan(z).any() or np.isposinf(z).any():
        raise InputError("the logits hold NaN or +inf (finite values or -inf expected)")
    if z.shape[-1] and (z == -np.inf).all(axis=-1).any():
        raise InputError("a row of logits is all -inf: nothing to sample")


@register
class Sample(Op):
    """One token id per row of ``logits [..., V]`` (see the module docstring for the
    exact contract). Inputs ``(logits[, offset])``, ``offset`` (when ``has_offset``) an
    integer scalar mixed into the random stream; attributes ``temperature`` (>= 0, 0 is
    greedy), ``top_k`` (0 disables), ``top_p`` (in (0, 1], 1 disables), ``seed`` (a
    64-bit unsigned int). Output int64 ``[...]``."""

    mnemonic: ClassVar[str] = "sample"
    kind: ClassVar[OpKind] = OpKind.REDUCTION
    nondiff: ClassVar[str] = "integer output (a sampled token id)"
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    has_offset: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "temperature", float(self.temperature))
        object.__setattr__(self, "top_p", float(self.top_p))

    def num_inputs(self) -> int:
        return 2 if self.has_offset else 1

    def infer(self, ins: tuple[Shape, ...]) -> Shape:
        x = ins[0]
        t, k, p, s = self.temperature, self.top_k, self.top_p, self.seed
        expect(math.isfinite(t) and t >= 0, self, f"temperature must be >= 0, got {t}")
        expect(isinstance(k, int) and k >= 0, self, f"top_k must be an int >= 0, got {k!r}")
        expect(0 < p <= 1, self, f"top_p must be in (0, 1], got {p}")
        expect(isinstance(s, int) and 0 <= s < 2**64, self, f"seed must be a u64 int, got {s!r}")
        expect(x.dtype.is_float and x.rank >= 1, self, f"logits must be float [..., V], got {x}")
        expect(x.dims[-1] != 0, self, f"logits {x} have no vocabulary (V = 0)")
        if self.has_offset:
            o = ins[1]
            expect(
                o.dtype.is_int and o.is_static and math.prod(o.dims) == 1,  # type: ignore[arg-type]
                self,
                f"offset must be a one-element integer tensor, got {o}",
            )
        return Shape(x.dims[:-1], DType.I64)

    def offset_of(self, xs: Sequence[np.ndarray]) -> int:
        return int(np.asarray(xs[1]).reshape(-1)[0]) if self.has_offset else 0

    def reference(self, xs: Sequence[np.ndarray], ctx: RefCtx) -> np.ndarray:
        logits = np.asarray(xs[0]).astype(np.float64)
        v = logits.shape[-1]
        z = logits.reshape(-1, v)
        check_rows(z)
        if self.temperature == 0:
            return np.argmax(z, axis=-1).reshape(ctx.out_dims)
        u = philox_uniform(z.shape[0], self.seed, self.offset_of(xs))
        out = np.empty(z.shape[0], np.int64)
        for r in range(z.shape[0]):
            out[r] = self._row(z[r] / self.temperature, u[r])
        return out.reshape(ctx.out_dims)

    def _row(self, z: np.ndarray, u: float) -> int:
        if 0 < self.top_k < z.size:
            kth = np.sort(z)[-self.top_k]
            z = np.where(z >= kth, z, -np.inf)
        e = np.exp(z - z.max())
        p = e / e.sum()
        if self.top_p < 1:
            order = np.argsort(-p, kind="stable")
            cum = np.cumsum(p[order])
            keep = int(np.searchsorted(cum, self.top_p, side="left")) + 1
            mask = np.zeros(p.size, bool)
            mask[order[:keep]] = True
            p = np.where(mask, p, 0.0)
        c = np.cumsum(p)
        return int(np.searchsorted(c, u * c[-1], side="right"))

    def attrs_str(self) -> str:
        return (
            f"temperature={self.temperature:g}, top_k={self.top_k}, top_p={self.top_p:g}, "
            f"seed={self.seed}, has_offset={self.has_offset}"
        )


@graph_method
def sample(
    g: Graph,
    logits: NodeId,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    offset: NodeId | None = None,
) -> NodeId:
    """Sample one token id per row of ``logits`` (see :class:`Sample`); ``offset`` is an
    optional integer scalar node (e.g. the decode step) varying the draw per run."""
    op = Sample(temperature, int(top_k), top_p, int(seed), offset is not None)
    return g.apply(op, [logits] if offset is None else [logits, offset])
