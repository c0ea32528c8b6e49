"""Weight-only quantization of a Hugging Face checkpoint while it loads. In: an
:class:`~rlx.models.llm.hf.HfCheckpoint` (memory-mapped, any of f32 / bf16 / f16) and a
precision name (:data:`PRECISIONS`: ``"int8"`` / ``"int4"``, rlx's Int8Block(32) /
Int4Block(32), or a GGUF block type such as ``"q8_0"``, ``"q4_k"``). Out: the checkpoint
with its matrices replaced by :class:`QuantTensor` (the packed arrays ``dequant_matmul``
reads) and a :class:`QuantReport` saying, per tensor, what was done (the scheme, bytes
before and after, the relative RMS error of the weight) or why it was kept as stored.

Tensor by tensor, a panel of rows at a time (about :data:`PANEL_BYTES` of f32): the
rows are read from the file with ``pread`` (not through the mapping, so the stored
bytes never become resident), widened to f32, packed by :func:`rlx.quant.pack.pack`
into the preallocated output, and dropped. Peak memory is the packed model plus one
panel and its packing temporaries: never the whole f32 (or bf16) model.

What is quantized: every 2-D projection and the LM head. The token embedding too for the
GGUF schemes (rows are decoded by ``dequant_gather``); for Int8Block / Int4Block it stays
as stored (a view of the file: only the rows of the tokens seen are read) and a tied LM
head gets its own quantized copy. A matrix whose row length is not a multiple of the
scheme's block is kept as stored, with the reason in the report. Norms and biases stay.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.formats import schemes as S
from rlx.formats.schemes import QuantScheme, dequantize_weight
from rlx.quant.pack import can_pack, pack

if TYPE_CHECKING:
    from rlx.models.llm.hf import HfCheckpoint, HfTensor

__all__ = [
    "PRECISIONS",
    "PANEL_BYTES",
    "QuantTensor",
    "TensorQuant",
    "QuantReport",
    "LogitError",
    "compare_logits",
    "precision_scheme",
    "quantize_checkpoint",
]

#: ``precision=`` names -> the scheme every matrix is packed in
PRECISIONS: dict[str, QuantScheme] = {
    "int8": S.Int8Block(32),
    "int4": S.Int4Block(32),
    "q8_0": S.GgufQ8_0(),
    "q5_0": S.GgufQ5_0(),
    "q5_1": S.GgufQ5_1(),
    "q4_0": S.GgufQ4_0(),
    "q4_1": S.GgufQ4_1(),
    "q6_k": S.GgufQ6K(),
    "q5_k": S.GgufQ5K(),
    "q4_k": S.GgufQ4K(),
}
#: f32 bytes of one panel of rows being quantized
PANEL_BYTES = 1 << 18


def precision_scheme(precision: str) -> QuantScheme:
    """The scheme of a precision name (case-insensitive); InputError listing the names."""
    scheme = PRECISIONS.get(precision.lower()) if isinstance(precision, str) else None
    if scheme is None:
        raise InputError(
            f"precision {precision!r} is not one rlx.models.llm quantizes to; supported: "
            f"{', '.join(PRECISIONS)}"
        )
    return scheme


@dataclass(frozen=True, eq=False)
class QuantTensor:
    """A matrix packed at load (the decoder builder's tensor interface): ``arrays`` are
    what ``dequant_matmul(scheme)`` takes after ``x`` (``(packed,)`` for GGUF schemes,
    ``(w_q, scale, zp)`` otherwise)."""

    name: str
    scheme: QuantScheme
    shape: tuple[int, ...]
    arrays: tuple[np.ndarray, ...] = field(repr=False)
    error: float = 0.0  # relative RMS error of the packed weight

    @property
    def type_name(self) -> str:
        """The scheme's name (``"Q4_K"``, ``"Int8Block(32)"``)."""
        return str(getattr(self.scheme, "gguf_name", "") or self.scheme)

    @property
    def nbytes(self) -> int:
        """Bytes of the packed arrays."""
        return sum(int(a.nbytes) for a in self.arrays)

    def packed(self) -> tuple[np.ndarray, ...]:
        """The packed arrays (``arrays``)."""
        return self.arrays

    def dequantize(self) -> np.ndarray:
        """The weight the packed arrays stand for, f32 ``shape``."""
        return dequantize_weight(self.scheme, *self.arrays).reshape(self.shape)


@dataclass(frozen=True)
class TensorQuant:
    """What loading did to one matrix: ``scheme`` (None: kept as stored, ``reason``
    says why), bytes in the file and in memory, and the relative RMS error of the
    packed weight (``||w - dequant(q)|| / ||w||``, 0 when kept)."""

    name: str
    scheme: str | None
    file_bytes: int
    bytes: int
    weight_error: float
    reason: str | None = None


@dataclass(frozen=True)
class LogitError:
    """Next-token logits of a quantized model against the same checkpoint unquantized
    (f32 products), after the same tokens: ``rel`` = max |diff| / max |reference|,
    ``rms`` = RMS diff / RMS reference, ``same_argmax``: the greedy token agrees."""

    rel: float
    rms: float
    same_argmax: bool
    tokens: int


@dataclass(frozen=True)
class QuantReport:
    """The quantization a model was loaded with (``LlmModel.quantization``)."""

    precision: str
    scheme: str
    tensors: tuple[TensorQuant, ...]

    @property
    def quantized_bytes(self) -> int:
        """Bytes of the packed matrices."""
        return sum(t.bytes for t in self.tensors if t.scheme is not None)

    @property
    def kept(self) -> tuple[TensorQuant, ...]:
        """The matrices kept as stored."""
        return tuple(t for t in self.tensors if t.scheme is None)

    @property
    def weight_error(self) -> float:
        """The largest relative RMS error of a packed matrix."""
        return max((t.weight_error for t in self.tensors), default=0.0)

    def summary(self) -> str:
        """One line: the scheme, the bytes, the matrices kept and the worst weight."""
        n = len(self.tensors) - len(self.kept)
        src = sum(t.file_bytes for t in self.tensors if t.scheme is not None)
        line = (
            f"{self.precision} ({self.scheme}): {n} matrices, {src / 2**20:.1f} MiB -> "
            f"{self.quantized_bytes / 2**20:.1f} MiB, weight error <= {self.weight_error:.2e}"
        )
        if self.kept:
            line += f"; kept as stored: {', '.join(t.name for t in self.kept)}"
        return line


def _read_rows(t: HfTensor, fd: int, start: int, stop: int) -> np.ndarray:
    """Rows ``start:stop`` of the 2-D tensor ``t`` as f32, read from its file."""
    k = t.shape[1]
    item = t.data.dtype.itemsize
    if t.file is None:  # not a view of a file (Gemma's 1 + w): the array itself
        return np.asarray(t.data[start:stop], dtype=np.float32)
    nbytes = (stop - start) * k * item
    raw = os.pread(fd, nbytes, t.offset + start * k * item)
    if len(raw) != nbytes:
        raise ModelError(f"{t.file}: tensor {t.name!r} is truncated (short read)")
    return np.frombuffer(raw, dtype=t.data.dtype).reshape(stop - start, k).astype(np.float32)


def _quantize(t: HfTensor, scheme: QuantScheme, fds: dict[Any, int]) -> QuantTensor:
    """Pack ``t`` panel by panel (module docstring)."""
    n, k = t.shape
    fd = -1
    if t.file is not None:
        if t.file not in fds:
            fds[t.file] = os.open(t.file, os.O_RDONLY)
        fd = fds[t.file]
    rows = max(1, min(n, PANEL_BYTES // (4 * k)))
    outs: list[np.ndarray] = []
    err = ref = 0.0
    for s in range(0, n, rows):
        e = min(n, s + rows)
        w = _read_rows(t, fd, s, e)
        parts = pack(scheme, w, t.name)
        if not outs:
            outs = [np.empty((n, *p.shape[1:]), p.dtype) for p in parts]
        for o, p in zip(outs, parts, strict=True):
            o[s:e] = p
        d = dequantize_weight(scheme, *parts) - w
        err += float(np.dot(d.ravel(), d.ravel()))
        ref += float(np.dot(w.ravel(), w.ravel()))
    for o in outs:  # read-only: the runtime keeps it as is (no private copy)
        o.flags.writeable = False
    return QuantTensor(t.name, scheme, (n, k), tuple(outs), (err / ref) ** 0.5 if ref > 0 else 0.0)


def quantize_checkpoint(ckpt: HfCheckpoint, precision: str) -> QuantReport:
    """Replace the matrices of ``ckpt`` (in place: ``tensors`` and, for a tied LM head
    under Int8Block / Int4Block, ``config``) by their packed form in ``precision``
    (module docstring) and return the report. InputError for an unknown precision."""
    scheme = precision_scheme(precision)
    cfg = ckpt.config
    tensors: dict[str, Any] = ckpt.tensors
    names = [
        k
        for k, t in tensors.items()
        if k.startswith("blk.") and len(t.shape) == 2 and "ffn_gate_inp" not in k
    ]
    head = "token_embd.weight" if cfg.tied_embeddings else "output.weight"
    gather_ok = scheme.is_gguf
    if gather_ok or not cfg.tied_embeddings:
        names.append(head)
    if not gather_ok and cfg.tied_embeddings:  # the head gets its own packed copy
        tensors["output.weight"] = tensors["token_embd.weight"]
        names.append("output.weight")
    if gather_ok and head != "token_embd.weight":
        names.append("token_embd.weight")
    done: list[TensorQuant] = []
    fds: dict[Any, int] = {}
    try:
        for key in names:
            t = tensors[key]
            file_bytes = int(np.prod(t.shape)) * t.data.dtype.itemsize
            why = can_pack(scheme, t.shape[1])
            if why is not None:
                done.append(TensorQuant(t.name, None, file_bytes, file_bytes, 0.0, why))
                continue
            q = _quantize(t, scheme, fds)
            tensors[key] = q
            tied = key == "output.weight" and cfg.tied_embeddings
            label = f"lm_head.weight (tied: {t.name})" if tied else t.name
            done.append(TensorQuant(label, q.type_name, file_bytes, q.nbytes, q.error))
    finally:
        for fd in fds.values():
            os.close(fd)
    if scheme.is_gguf and cfg.moe is not None:
        _stack_experts(tensors, cfg.num_layers, cfg.moe.experts)
    if "output.weight" in tensors and cfg.tied_embeddings:
        ckpt.config = dataclasses.replace(cfg, tied_embeddings=False)
    return QuantReport(precision.lower(), str(scheme), tuple(done))


def _stack_experts(tensors: dict[str, Any], layers: int, experts: int) -> None:
    """Each layer's packed experts ``blk.i.ffn_{gate,up,down}.{j}.weight`` as one stack
    ``blk.i.ffn_{part}_exps.weight`` (u8 ``[E, N, row bytes]``, what
    ``dequant_grouped_matmul`` reads), in place; a layer whose experts are not all
    packed alike stays one tensor per expert."""
    for i in range(layers):
        for part in ("gate", "up", "down"):
            keys = [f"blk.{i}.ffn_{part}.{j}.weight" for j in range(experts)]
            ts = [tensors.get(k) for k in keys]
            first = ts[0]
            if not isinstance(first, QuantTensor) or not all(
                isinstance(t, QuantTensor) and t.scheme == first.scheme for t in ts
            ):
                continue
            del ts  # each expert's arrays are dropped as soon as they are in the stack
            (packed,) = first.arrays
            stack = np.empty((experts, *packed.shape), packed.dtype)
            for j, k in enumerate(keys):
                stack[j] = tensors.pop(k).arrays[0]
            stack.flags.writeable = False
            name = re.sub(r"experts\.0\.", "experts.*.", first.name)
            tensors[f"blk.{i}.ffn_{part}_exps.weight"] = QuantTensor(
                name, first.scheme, (experts, *first.shape), (stack,), first.error
            )


def compare_logits(got: np.ndarray, ref: np.ndarray, tokens: int) -> LogitError:
    """:class:`LogitError` of logits ``got`` against ``ref`` (both f32 ``[vocab]``)."""
    d = got.astype(np.float64) - ref.astype(np.float64)
    rel = float(np.abs(d).max() / max(float(np.abs(ref).max()), 1e-30))
    rms = float(np.sqrt((d**2).mean() / max(float((ref.astype(np.float64) ** 2).mean()), 1e-30)))
    return LogitError(rel, rms, int(got.argmax()) == int(ref.argmax()), tokens)
