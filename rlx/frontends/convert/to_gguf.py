"""Hugging Face directory -> GGUF file (:func:`hf_to_gguf`): llama.cpp's metadata keys and
tensor names, the tokenizer, and the tensor types of each ``--type``."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError
from rlx.frontends.convert.common import (
    _BLOCK,
    _BYTE,
    _CONTROL,
    _FALLBACK,
    _FILE_TYPE,
    _MATRIX_TYPE,
    _NORMAL,
    _UNKNOWN,
    _UNUSED,
    _USER_DEFINED,
    _VALUE_TYPES,
    ConvertResult,
    GgufType,
    _bar,
    _check_destination,
    _parse_type,
    _permute,
)

# ---- tensor types -------------------------------------------------------------------


def _use_more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's ``use_more_bits``: the first and last eighth, every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def _fit(tname: str, k: int) -> str:
    """``tname`` or its llama.cpp fallback for rows of ``k`` values."""
    while tname in _BLOCK and k % _BLOCK[tname]:
        tname = _FALLBACK.get(tname, "F16")
    return tname


def q4_k_m_types(
    shapes: Mapping[str, tuple[int, ...]], num_layers: int, tied: bool
) -> dict[str, str]:
    """The ggml type of each tensor (GGUF name -> shape) in the q4_k_m mix (module
    docstring)."""
    out: dict[str, str] = {}
    for name, shape in shapes.items():
        if len(shape) < 2:
            out[name] = "F32"
            continue
        t = "Q4_K"
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            t = "Q6_K"
        elif name.endswith(("attn_v.weight", "ffn_down.weight")) and name.startswith("blk."):
            if _use_more_bits(int(name.split(".")[1]), num_layers):
                t = "Q6_K"
        out[name] = _fit(t, shape[-1])
    return out


def _types(
    kind: GgufType, shapes: Mapping[str, tuple[int, ...]], num_layers: int, tied: bool
) -> dict[str, str]:
    if kind is GgufType.Q4_K_M:
        return q4_k_m_types(shapes, num_layers, tied)
    mt = _MATRIX_TYPE[kind]
    return {n: _fit(mt, s[-1]) if len(s) >= 2 else "F32" for n, s in shapes.items()}


# ---- HF -> GGUF: metadata ------------------------------------------------------------


def _model_metadata(ck: Any, kind: GgufType) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """llama.cpp's ``general.*`` / ``{arch}.*`` keys of a checkpoint, and extra tensors
    (Llama 3's ``rope_freqs.weight``)."""
    from rlx.models.llm.hf_config import _ropes

    c = ck.config
    a = c.arch.name
    hf = ck.hf_config
    md: dict[str, Any] = {
        "general.architecture": a,
        "general.type": "model",
        "general.name": ck.path.resolve().name,
        "general.file_type": _FILE_TYPE[kind],
        f"{a}.context_length": c.context_length,
        f"{a}.embedding_length": c.hidden,
        f"{a}.block_count": c.num_layers,
        f"{a}.feed_forward_length": c.ffn,
        f"{a}.attention.head_count": c.num_heads,
        f"{a}.attention.head_count_kv": c.num_kv_heads,
        f"{a}.attention.layer_norm_rms_epsilon": c.eps,
        f"{a}.rope.freq_base": c.rope_base,
        f"{a}.attention.key_length": c.head_dim,
        f"{a}.attention.value_length": c.head_dim,
    }
    if a == "llama":
        md[f"{a}.rope.dimension_count"] = c.rope_dims
        md[f"{a}.vocab_size"] = c.vocab
    if c.sliding_window:
        md[f"{a}.attention.sliding_window"] = c.sliding_window
    if c.logit_softcap:
        md[f"{a}.final_logit_softcapping"] = c.logit_softcap
    if c.attn_softcap:  # read by llama.cpp for gemma2 only (_check_expressible)
        md[f"{a}.attn_logit_softcapping"] = c.attn_softcap
    if c.rope_scale != 1.0:
        md[f"{a}.rope.scaling.type"] = "linear"
        md[f"{a}.rope.scaling.factor"] = c.rope_scale
    extra: dict[str, np.ndarray] = {}
    full = _ropes(hf, ck.path / "config.json")["full_attention"]
    if full[2] is not None and full[2][0] != "llama3":
        raise ModelError(
            f"{ck.path}: rope type {full[2][0]!r} has no GGUF form rlx writes; "
            f"rlx convert writes default, linear and llama3 rope"
        )
    if full[2] is not None:  # Llama 3: llama.cpp stores 1 / the per-frequency factor
        base = full[0]
        plain = 1.0 / (base ** (np.arange(0, c.rope_dims, 2, dtype=np.float32) / c.rope_dims))
        assert c.rope_inv_freq is not None
        extra["rope_freqs.weight"] = (plain / np.asarray(c.rope_inv_freq, np.float32)).astype(
            np.float32
        )
    if a == "gemma3" and c.sliding_layers is not None:
        want = tuple((i + 1) % 6 != 0 for i in range(c.num_layers))
        if c.sliding_layers != want:
            raise ModelError(
                f"{ck.path}: the sliding-window layers {c.sliding_layers} are not Gemma 3's "
                f"pattern of 5 local + 1 global, which is all a gemma3 GGUF can express"
            )
    return md, extra


def _split_regex(pre: Any) -> list[str]:
    """The Split regexes of a tokenizer.json pre-tokenizer."""
    if not isinstance(pre, Mapping):
        return []
    if pre.get("type") == "Sequence":
        return [r for p in pre.get("pretokenizers", []) for r in _split_regex(p)]
    if pre.get("type") == "Split" and isinstance(pre.get("pattern"), Mapping):
        r = pre["pattern"].get("Regex")
        return [r] if isinstance(r, str) else []
    return []


def _has(node: Any, kind: str) -> bool:
    """Whether a tokenizer.json component (or a Sequence of them) holds ``kind``."""
    if not isinstance(node, Mapping):
        return False
    if node.get("type") == kind:
        return True
    subs = [*node.get("pretokenizers", []), *node.get("normalizers", []), *node.get("decoders", [])]
    return any(_has(s, kind) for s in subs)


def _prepends_space(normalizer: Any, pre: Any) -> bool:
    if isinstance(normalizer, Mapping):
        if normalizer.get("type") == "Prepend":
            return True
        if any(_prepends_space(n, None) for n in normalizer.get("normalizers", [])):
            return True
    if isinstance(pre, Mapping):
        if pre.get("type") == "Metaspace":
            return pre.get("prepend_scheme", "always") in ("always", "first") or bool(
                pre.get("add_prefix_space")
            )
        return any(_prepends_space(None, p) for p in pre.get("pretokenizers", []))
    return False


def _tokenizer_metadata(folder: Path, rows: int, arch: str) -> dict[str, Any]:
    """The ``tokenizer.ggml.*`` keys of ``folder``'s tokenizer.json (padded to the
    embedding's ``rows``), as llama.cpp's converter writes them; {} without the file."""
    from rlx.frontends.gguf.bpe import PRE_TOKENIZER_SPLITS
    from rlx.models.llm.hf_tokenizer import HfTokenizer

    file = folder / "tokenizer.json"
    if not file.is_file():
        return {}
    try:
        tj = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{file}: not a readable JSON file ({e})") from None
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ModelError(
            f"{file}: tokenizer model {model.get('type')!r} cannot be written to GGUF by rlx; "
            f"supported: BPE (byte-level, or SentencePiece-style with byte fallback)"
        )
    vocab: dict[str, int] = dict(model.get("vocab") or {})
    added = [t for t in tj.get("added_tokens") or [] if isinstance(t, Mapping)]
    n = max([rows, *(i + 1 for i in vocab.values()), *(int(t["id"]) + 1 for t in added)])
    if n > rows:
        raise ModelError(f"{file}: the tokenizer has {n} tokens, the embedding only {rows} rows")
    slots: list[str | None] = [None] * n
    types = [_NORMAL] * n
    for piece, i in vocab.items():
        slots[i] = piece
    for t in added:
        i = int(t["id"])
        slots[i] = str(t["content"])
        types[i] = _CONTROL if t.get("special") else _USER_DEFINED
    for i, slot in enumerate(slots):
        if slot is None:
            types[i] = _UNUSED  # rows beyond the tokenizer, as llama.cpp pads them
    tokens = [f"[PAD{i}]" if slot is None else slot for i, slot in enumerate(slots)]
    byte_level = _has(tj.get("pre_tokenizer"), "ByteLevel") or _has(tj.get("decoder"), "ByteLevel")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    md: dict[str, Any] = {}
    if byte_level:
        regexes = _split_regex(tj.get("pre_tokenizer"))
        usual = {"qwen2": "qwen2", "qwen3": "qwen2", "llama": "llama-bpe"}.get(arch, "gpt2")
        names = [usual, *PRE_TOKENIZER_SPLITS]  # the architecture's usual name first
        pre = next((k for r in regexes for k in names if PRE_TOKENIZER_SPLITS[k] == r), None)
        if pre is None:
            pre = usual if regexes else "default"
        md["tokenizer.ggml.model"] = "gpt2"
        md["tokenizer.ggml.pre"] = pre
    else:
        if not model.get("byte_fallback"):
            raise ModelError(
                f"{file}: a BPE tokenizer that is neither byte-level nor SentencePiece-style "
                f"(byte_fallback) cannot be written to GGUF by rlx"
            )
        ranks: dict[str, int] = {}
        for r, m in enumerate(merges):
            ranks.setdefault(m.replace(" ", "", 1), r)
        scores = [-float(ranks.get(str(t), len(merges))) for t in tokens]
        unk = model.get("unk_token")
        for i, text in enumerate(tokens):
            if types[i] == _NORMAL and len(text) == 6 and text.startswith("<0x"):
                types[i] = _BYTE
            if unk is not None and text == unk:
                types[i] = _UNKNOWN
        md["tokenizer.ggml.model"] = "llama"
        md["tokenizer.ggml.pre"] = "default"
        md["tokenizer.ggml.scores"] = scores
        md["tokenizer.ggml.add_space_prefix"] = _prepends_space(
            tj.get("normalizer"), tj.get("pre_tokenizer")
        )
        if unk is not None and unk in vocab:
            md["tokenizer.ggml.unknown_token_id"] = vocab[unk]
    md["tokenizer.ggml.tokens"] = tokens
    md["tokenizer.ggml.token_type"] = types
    if byte_level:
        md["tokenizer.ggml.merges"] = merges
    hft = HfTokenizer(folder)
    if hft.bos_id is not None:
        md["tokenizer.ggml.bos_token_id"] = hft.bos_id
    if hft.eos_id is not None:
        md["tokenizer.ggml.eos_token_id"] = hft.eos_id
    cfg_file = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8")) if cfg_file.is_file() else {}
    pad = cfg.get("pad_token")
    pad = pad.get("content") if isinstance(pad, Mapping) else pad
    if isinstance(pad, str) and pad in tokens:
        md["tokenizer.ggml.padding_token_id"] = tokens.index(pad)
    md["tokenizer.ggml.add_bos_token"] = hft.add_bos
    md["tokenizer.ggml.add_eos_token"] = hft.add_eos
    return md


def _check_expressible(ck: Any, md: Mapping[str, Any], rope_freqs: bool) -> None:
    """ModelError when the GGUF metadata would read back (as llama.cpp and rlx read it)
    as another model than the checkpoint: attention scale, soft-capping, per-layer rope
    and, except for Llama / Mistral (whose window llama.cpp ignores too), the sliding
    window layers."""
    from rlx.models.llm.config import read_config

    c = ck.config
    back = read_config(c.arch.name, md, ck.tensors)
    n = c.num_layers
    checks: list[tuple[str, Any, Any]] = [
        ("the attention scale", c.attn_scale, back.attn_scale),
        ("the logit soft-capping", c.logit_softcap, back.logit_softcap),
        ("the attention-logit soft-capping", c.attn_softcap, back.attn_softcap),
        ("the rope base / scale per layer", [c.rope(i) for i in range(n)],
         [back.rope(i) for i in range(n)]),
    ]  # fmt: skip
    if c.arch.name != "llama":
        checks.append(
            ("the sliding-window layers", [c.window(i) for i in range(n)],
             [back.window(i) for i in range(n)]),
        )  # fmt: skip
    if not rope_freqs:
        checks.append(("the rope frequencies", c.rope_inv_freq, back.rope_inv_freq))
    for what, want, got in checks:
        same = (
            math.isclose(want, got, rel_tol=1e-6)
            if isinstance(want, float) and isinstance(got, float)
            else want == got
        )
        if not same:
            raise ModelError(
                f"{ck.path}: {what} of this checkpoint ({want}) cannot be expressed in a "
                f"{c.arch.name} GGUF (it would read as {got})"
            )


class _Prepared(Mapping[str, np.ndarray]):
    """The checkpoint's tensors as GGUF arrays, made one at a time when :func:`rlx.gguf.save`
    reads them (f32, Llama's q / k permuted), ticking ``bar``."""

    def __init__(self, ck: Any, extra: Mapping[str, np.ndarray], bar: Any):
        self.ck, self.extra, self.bar = ck, extra, bar
        self.names = [*ck.tensors, *extra]

    def __len__(self) -> int:
        return len(self.names)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __getitem__(self, name: str) -> np.ndarray:
        if name in self.extra:
            return self.extra[name]
        c = self.ck.config
        t = self.ck.tensors[name]
        w = t.dequantize()
        if c.arch.name == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            w = _permute(w, c.num_heads if "attn_q" in name else c.num_kv_heads)
        if self.bar is not None:
            self.bar.update(int(t.data.nbytes))
        return np.ascontiguousarray(w)


def hf_to_gguf(
    hf_dir: str | os.PathLike[str],
    out: str | os.PathLike[str],
    type: GgufType | str = GgufType.F16,
    force: bool = False,
    progress: bool | None = None,
) -> ConvertResult:
    """Write the Hugging Face decoder directory ``hf_dir`` as the GGUF file ``out`` with
    weights of ``type`` (module docstring) -> :class:`ConvertResult`. ModelError for an
    unsupported architecture, config value or tokenizer; InputError for an unknown type
    or an existing ``out`` without ``force``."""
    from rlx.frontends import gguf
    from rlx.models.llm.hf import open_checkpoint

    kind = _parse_type(type, GgufType)
    dest = Path(out)
    _check_destination(dest, force, file=True)
    src = Path(hf_dir)
    if not src.is_dir():
        raise InputError(f"{src} is not a directory (a Hugging Face model directory)")
    ck = open_checkpoint(src)
    c = ck.config
    md, extra = _model_metadata(ck, kind)
    _check_expressible(ck, md, "rope_freqs.weight" in extra)
    md.update(_tokenizer_metadata(src, c.vocab, c.arch.name))
    if "tokenizer.chat_template" in ck.metadata:
        md["tokenizer.chat_template"] = ck.metadata["tokenizer.chat_template"]
    shapes = {n: tuple(t.shape) for n, t in ck.tensors.items()}
    schemes: dict[str, str | None] = dict(_types(kind, shapes, c.num_layers, c.tied_embeddings))
    schemes.update({n: "F32" for n in extra})
    total = sum(int(t.data.nbytes) for t in ck.tensors.values())
    bar = _bar(total, f"converting {src.name}", progress)
    try:
        written = gguf.save(
            dest, _Prepared(ck, extra, bar), metadata=md, schemes=schemes,
            metadata_types=_VALUE_TYPES, architecture=c.arch.name,
        )  # fmt: skip
    finally:
        if bar is not None:
            bar.close()
    return ConvertResult(dest, c.arch.name, written)
