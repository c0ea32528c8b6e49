"""Conversion between Hugging Face decoder directories and GGUF files, both ways.

* :func:`hf_to_gguf`: In: a directory :func:`rlx.models.llm.load` reads (Llama / Mistral,
  Qwen2, Qwen3, Gemma 3: config.json, safetensors, tokenizer.json, tokenizer_config.json).
  Out: a GGUF file as llama.cpp's ``convert_hf_to_gguf.py`` writes it: llama.cpp's
  metadata keys and tensor names, Llama's q / k rows permuted for its adjacent-pair rope,
  Gemma's norms stored as ``1 + w``, the tokenizer (tokens, token types, merges or
  scores, special ids, flags) and the chat template. Weights are written as a
  :class:`GgufType` (f32, f16, bf16, q8_0, q4_k_m), quantized with rlx's packers
  (:func:`rlx.gguf.save`).
* :func:`gguf_to_hf`: In: a GGUF file of one of those architectures. Out: a directory
  transformers loads (``AutoModelForCausalLM`` / ``AutoTokenizer``): config.json,
  generation_config.json, model.safetensors (weights dequantized with gguf-py, written
  as f32, f16 or bf16), tokenizer.json (built with the ``tokenizers`` library from the
  GGUF vocabulary) and tokenizer_config.json with the chat template.

Both write into a temporary name beside the destination and rename it at the end, so a
failure or an interrupt leaves no partial output; an existing destination is an error
unless ``force``. Large tensors tick a tqdm bar on stderr (when tqdm is installed and
stderr is a terminal).

The ``q4_k_m`` mix follows llama.cpp's ``llama_tensor_get_type`` for Q4_K_M: the output
projection (the token embedding when they are tied) is Q6_K; ``attn_v`` and
``ffn_down`` are Q6_K in the first and last eighth of the layers and every third layer
between, Q4_K elsewhere; every other matrix is Q4_K; 1-D tensors (norms, biases) stay
F32. A matrix whose rows are not a multiple of 256 falls back as llama.cpp's does (Q4_K
-> Q5_0, Q6_K -> Q8_0), and to F16 when not a multiple of 32 (q8_0 likewise).
"""

from __future__ import annotations

import enum
import json
import math
import os
import shutil
import struct
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError, ModelError

__all__ = [
    "GgufType",
    "HfType",
    "ConvertResult",
    "convert",
    "hf_to_gguf",
    "gguf_to_hf",
    "q4_k_m_types",
    "SUPPORTED_ARCHITECTURES",
]

#: GGUF ``general.architecture`` values converted both ways.
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")


class GgufType(enum.Enum):
    """The weight type of a GGUF written from a Hugging Face directory (the value is the
    ``--type`` name)."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    Q8_0 = "q8_0"
    Q4_K_M = "q4_k_m"


class HfType(enum.Enum):
    """The dtype of the safetensors weights written from a GGUF file."""

    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"


# llama.cpp's ``general.file_type`` (LlamaFileType) of each GgufType
_FILE_TYPE = {
    GgufType.F32: 0,
    GgufType.F16: 1,
    GgufType.Q8_0: 7,
    GgufType.Q4_K_M: 15,
    GgufType.BF16: 32,
}
# the ggml type of 2-D weights (before fallbacks); q4_k_m is a mix (q4_k_m_types)
_MATRIX_TYPE = {
    GgufType.F32: "F32",
    GgufType.F16: "F16",
    GgufType.BF16: "BF16",
    GgufType.Q8_0: "Q8_0",
}
_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}
_BLOCK = {"Q4_K": 256, "Q6_K": 256, "Q5_0": 32, "Q8_0": 32}

# GGUF value types llama.cpp insists on (the writer would pick UINT32 for token types)
_VALUE_TYPES = {
    "tokenizer.ggml.token_type": "ARRAY[INT32]",
    "tokenizer.ggml.scores": "ARRAY[FLOAT32]",
}
# GGUF token types (llama.cpp's llama_token_type)
_NORMAL, _UNKNOWN, _CONTROL, _USER_DEFINED, _UNUSED, _BYTE = 1, 2, 3, 4, 5, 6


@dataclass(frozen=True)
class ConvertResult:
    """What a conversion wrote: ``path`` (the GGUF file or the HF directory),
    ``architecture``, and ``tensors`` (name in the written file -> its type: a ggml type
    name such as "Q4_K", or a safetensors dtype such as "F32")."""

    path: Path
    architecture: str
    tensors: dict[str, str]


def _parse_type(value: GgufType | HfType | str, kind: type[enum.Enum]) -> Any:
    if isinstance(value, kind):
        return value
    names = [str(t.value) for t in kind]
    if isinstance(value, str) and value.lower() in names:
        return kind(value.lower())
    what = "a GGUF file" if kind is GgufType else "a Hugging Face directory"
    raise InputError(f"--type {value!r} is not a type rlx writes {what} as; one of {names}")


def _check_destination(dest: Path, force: bool, file: bool) -> None:
    """InputError for an existing ``dest`` without ``force``, a directory where a
    ``file`` is written, or a missing parent directory."""
    if dest.exists() or dest.is_symlink():
        if not force:
            raise InputError(f"{dest} exists; pass force=True (--force) to replace it")
        if file and dest.is_dir():
            raise InputError(f"{dest} is a directory; a GGUF file cannot replace it")
    if not dest.parent.is_dir():
        raise InputError(f"{dest.parent} is not a directory (the destination's parent)")


def _bar(total: int, desc: str, progress: bool | None) -> Any:
    """A tqdm bar over ``total`` bytes (None: shown when stderr is a terminal; False: none;
    no bar either when tqdm is not installed)."""
    if progress is False:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(
        total=total, desc=desc, unit="B", unit_scale=True, leave=False,
        disable=None if progress is None else False,
    )  # fmt: skip


# ---- q / k row order ----------------------------------------------------------------


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Transformers' rotate-half q / k rows -> llama.cpp's adjacent-pair order (its
    converter's ``LlamaModel.permute``)."""
    return (
        w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
    )


def _unpermute(w: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of :func:`_permute`."""
    return (
        w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
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


# ---- GGUF -> HF ---------------------------------------------------------------------


def _hf_names(arch: str) -> dict[str, str]:
    """GGUF tensor name (``blk.{i}.`` as ``blk.#.``) -> transformers' name."""
    from rlx.models.llm.hf import _LAYER, _LAYER_GEMMA, _LAYER_PLAIN, _TOP

    out = {g: h for h, g in _TOP.items()}
    layer = {**_LAYER, **(_LAYER_GEMMA if arch == "gemma3" else _LAYER_PLAIN)}
    out.update({f"blk.#.{g}": f"model.layers.#.{h}" for h, g in layer.items()})
    return out


def _hf_name(name: str, table: Mapping[str, str], where: Path) -> str:
    parts = name.split(".", 2)
    if parts[0] == "blk" and len(parts) == 3 and parts[1].isdigit():
        hf = table.get(f"blk.#.{parts[2]}")
        if hf is not None:
            return hf.replace("#", parts[1], 1)
    elif name in table:
        return table[name]
    raise ModelError(f"{where}: tensor {name!r} has no Hugging Face counterpart rlx knows")


def _dequantize(t: Any) -> np.ndarray:
    """A GGUF tensor's values as f32 (block types decoded by gguf-py)."""
    if t.scheme is None:
        return np.asarray(t.data).astype(np.float32).reshape(t.shape)
    import gguf

    qt = gguf.GGMLQuantizationType[t.type_name]
    return np.asarray(gguf.quants.dequantize(np.asarray(t.data), qt), np.float32).reshape(t.shape)


def _short(v: float) -> float:
    """An f32 metadata value as the shortest decimal that reads back as it (1e-06, not
    9.999999974752427e-07)."""
    return float(np.format_float_scientific(np.float32(v), unique=True))


def _hf_config(cfg: Any, meta: Mapping[str, Any], dtype: HfType) -> dict[str, Any]:
    """transformers' config.json of a GGUF model."""
    a = cfg.arch.name
    name, model_type = {
        "llama": ("LlamaForCausalLM", "llama"),
        "qwen2": ("Qwen2ForCausalLM", "qwen2"),
        "qwen3": ("Qwen3ForCausalLM", "qwen3"),
        "gemma3": ("Gemma3ForCausalLM", "gemma3_text"),
    }[a]
    out: dict[str, Any] = {
        "architectures": [name],
        "model_type": model_type,
        "vocab_size": cfg.vocab,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": _short(cfg.eps),
        "max_position_embeddings": cfg.context_length,
        "rope_theta": _short(cfg.rope_base),
        "tie_word_embeddings": cfg.tied_embeddings,
        "torch_dtype": {"f32": "float32", "f16": "float16", "bf16": "bfloat16"}[dtype.value],
    }
    if cfg.rope_scale != 1.0:
        out["rope_scaling"] = {"rope_type": "linear", "factor": cfg.rope_scale}
    for key, mk in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id")):
        v = meta.get(f"tokenizer.ggml.{mk}")
        if isinstance(v, int):
            out[key] = v
    pad = meta.get("tokenizer.ggml.padding_token_id")
    if isinstance(pad, int):
        out["pad_token_id"] = pad
    if a == "gemma3":
        out.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=round(1.0 / cfg.attn_scale**2),
            sliding_window=cfg.sliding_window or None,
            layer_types=[
                "sliding_attention" if cfg.is_sliding(i) else "full_attention"
                for i in range(cfg.num_layers)
            ],
            rope_local_base_freq=cfg.arch.rope_base_local,
            final_logit_softcapping=cfg.logit_softcap,
            attn_logit_softcapping=None,
        )
    else:
        out["hidden_act"] = "silu"
        if a == "llama":
            out["attention_bias"] = cfg.attn_bias
            out["mlp_bias"] = False
        if cfg.sliding_window:
            out["sliding_window"] = cfg.sliding_window
            if a != "llama":
                out["use_sliding_window"] = True
                out["max_window_layers"] = 0
        elif a != "llama":
            out["use_sliding_window"] = False
    return out


def _spm_merges(tokens: list[str], order: list[float], skip: set[int]) -> list[tuple[str, str]]:
    """SentencePiece-BPE merges implied by a vocabulary: every split of a token into two
    tokens, best (highest ``order``) first, as transformers' GGUF import derives them."""
    vocab = {t: i for i, t in enumerate(tokens) if i not in skip}
    found: list[tuple[float, int, int, str, str]] = []
    for tok, i in vocab.items():
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            li, ri = vocab.get(left), vocab.get(right)
            if li is not None and ri is not None:
                found.append((-order[i], li, ri, left, right))
    found.sort()
    return [(f[3], f[4]) for f in found]


def _hf_tokenizer(meta: Mapping[str, Any], arch: str) -> Any:
    """A ``tokenizers.Tokenizer`` equal to the GGUF vocabulary's (llama.cpp's rules:
    control and user-defined tokens matched whole in the raw text; SentencePiece BPE
    merging by score with byte fallback, or byte-level BPE with the merges)."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
    )

    from rlx.frontends.gguf.bpe import PRE_TOKENIZER_SPLITS

    tokens = [str(t) for t in meta["tokenizer.ggml.tokens"]]
    n = len(tokens)
    types = list(meta.get("tokenizer.ggml.token_type") or [_NORMAL] * n)
    kind = meta.get("tokenizer.ggml.model")
    special = {i for i, ty in enumerate(types) if ty in (_CONTROL, _USER_DEFINED, _UNUSED)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    if kind == "gpt2":
        pairs = [str(m).split(" ", 1) for m in meta.get("tokenizer.ggml.merges") or []]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab, [(p[0], p[-1]) for p in pairs], ignore_merges=False))
        pre = str(meta.get("tokenizer.ggml.pre", "default"))
        split = PRE_TOKENIZER_SPLITS.get(pre)
        if split is None:
            raise ModelError(
                f"tokenizer.ggml.pre {pre!r} cannot be written as a Hugging Face tokenizer; "
                f"supported: {', '.join(PRE_TOKENIZER_SPLITS)}"
            )
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tok.decoder = decoders.ByteLevel()
    elif kind == "llama":
        scores = [float(s) for s in meta.get("tokenizer.ggml.scores") or [0.0] * n]
        # Gemma's scores do not rank its merges; llama.cpp ranks by score
        order = scores
        merges = _spm_merges(
            tokens, order, special | {i for i, t in enumerate(types) if t == _BYTE}
        )
        unk = tokens[unk_id] if isinstance(unk_id, int) else None
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
        space = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        norms = [normalizers.Prepend("\u2581")] if space else []
        tok.normalizer = normalizers.Sequence([*norms, normalizers.Replace(" ", "\u2581")])
        decs = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        if space:
            decs.append(decoders.Strip(" ", 1, 0))
        tok.decoder = decoders.Sequence(decs)
    else:
        raise ModelError(
            f"tokenizer.ggml.model {kind!r} cannot be written as a Hugging Face tokenizer; "
            f"supported: gpt2, llama"
        )
    added = [
        AddedToken(tokens[i], special=types[i] != _USER_DEFINED, normalized=False)
        for i in sorted(special)
        if tokens[i]
    ]
    tok.add_special_tokens([a for a in added if a.special])
    tok.add_tokens([a for a in added if not a.special])
    bos = meta.get("tokenizer.ggml.bos_token_id")
    eos = meta.get("tokenizer.ggml.eos_token_id")
    ends: list[tuple[str, int]] = []  # (BOS / EOS text, id) the post-processor adds
    if isinstance(bos, int) and meta.get("tokenizer.ggml.add_bos_token", kind == "llama"):
        ends.append((tokens[bos], bos))
    single = " ".join([*(t for t, _ in ends), "$A:0"])
    if isinstance(eos, int) and meta.get("tokenizer.ggml.add_eos_token", False):
        ends.append((tokens[eos], eos))
        single += f" {tokens[eos]}"
    spec = ends
    post: list[Any] = []
    if kind == "gpt2":
        post.append(processors.ByteLevel(trim_offsets=False))
    if spec:
        post.append(
            processors.TemplateProcessing(single=single, pair=f"{single} $B:1", special_tokens=spec)
        )
    if post:
        tok.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]
    return tok


def _safetensors_header(entries: list[tuple[str, str, tuple[int, ...], int]]) -> bytes:
    head: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dt, shape, nbytes in entries:
        head[name] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    raw = json.dumps(head, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def _write_tensors(
    file: Path,
    names: list[tuple[str, Any]],
    make: Callable[[str, Any], np.ndarray],
    dtype: HfType,
    bar: Any,
) -> dict[str, str]:
    """Stream ``names`` (HF name, GGUF tensor) into one safetensors ``file`` as ``dtype``."""
    import ml_dtypes

    np_dtype = {
        HfType.F32: np.dtype("<f4"),
        HfType.F16: np.dtype("<f2"),
        HfType.BF16: np.dtype(ml_dtypes.bfloat16),
    }[dtype]
    st = {HfType.F32: "F32", HfType.F16: "F16", HfType.BF16: "BF16"}[dtype]
    entries = [
        (hf, st, tuple(t.shape), int(np.prod(t.shape, dtype=np.int64)) * np_dtype.itemsize)
        for hf, t in names
    ]
    with open(file, "wb") as fh:
        fh.write(_safetensors_header(entries))
        for (hf, t), (_, _, _, nbytes) in zip(names, entries, strict=True):
            arr = np.ascontiguousarray(make(hf, t).astype(np_dtype))
            assert arr.nbytes == nbytes, hf
            fh.write(arr.reshape(-1).view(np.uint8).data)
            if bar is not None:
                bar.update(int(t.data.nbytes))
    return {hf: st for hf, _ in names}


def gguf_to_hf(
    gguf_path: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
    type: HfType | str = HfType.F32,
    force: bool = False,
    progress: bool | None = None,
) -> ConvertResult:
    """Write the GGUF file ``gguf_path`` as the Hugging Face directory ``out_dir`` with
    safetensors weights of ``type`` (module docstring) -> :class:`ConvertResult`.
    ModelError for an unsupported architecture or tokenizer; InputError for an unknown
    type or an existing ``out_dir`` without ``force``."""
    from rlx.frontends import gguf
    from rlx.models.llm.config import read_config

    kind = _parse_type(type, HfType)
    src = Path(gguf_path)
    dest = Path(out_dir)
    _check_destination(dest, force, file=False)
    f = gguf.load(src)
    if f.architecture not in SUPPORTED_ARCHITECTURES:
        raise ModelError(
            f"{src}: GGUF architecture {f.architecture!r} cannot be converted by rlx; "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )
    cfg = read_config(f.architecture, f.metadata, f.tensors)
    a = cfg.arch.name
    table = _hf_names(a)
    names = [(_hf_name(n, table, src), t) for n, t in f.tensors.items() if n != "rope_freqs.weight"]
    if "rope_freqs.weight" in f.tensors:
        raise ModelError(
            f"{src}: rope_freqs.weight (Llama 3 rope scaling) cannot be converted back by rlx"
        )

    def make(hf: str, t: Any) -> np.ndarray:
        w = _dequantize(t)
        if a == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            w = _unpermute(w, cfg.num_heads if "q_proj" in hf else cfg.num_kv_heads)
        if a == "gemma3" and hf.endswith("norm.weight"):  # the file holds 1 + w
            w = w - np.float32(1.0)
        return w

    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    bar = _bar(sum(int(t.data.nbytes) for _, t in names), f"converting {src.name}", progress)
    try:
        written = _write_tensors(tmp / "model.safetensors", names, make, kind, bar)
        meta = f.metadata
        config = _hf_config(cfg, meta, kind)
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        gen: dict[str, Any] = {"_from_model_config": True}
        if "tokenizer.ggml.tokens" in meta:
            _write_tokenizer(tmp, meta, a, gen)
        for key in ("bos_token_id", "pad_token_id"):
            if key in config:
                gen.setdefault(key, config[key])
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
        old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
        if dest.exists() or dest.is_symlink():  # --force: moved aside, removed at the end
            os.replace(dest, old)
        os.replace(tmp, dest)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        elif old.exists() or old.is_symlink():
            old.unlink()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        if bar is not None:
            bar.close()
    return ConvertResult(dest, a, written)


def _write_tokenizer(folder: Path, meta: Mapping[str, Any], arch: str, gen: dict[str, Any]) -> None:
    """tokenizer.json and tokenizer_config.json (and the stop ids in ``gen``)."""
    from rlx.frontends.gguf.tokenizer import GgufTokenizer

    tok = _hf_tokenizer(meta, arch)
    tok.save(str(folder / "tokenizer.json"))
    tokens = meta["tokenizer.ggml.tokens"]

    def text(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}")
        return str(tokens[i]) if isinstance(i, int) and 0 <= i < len(tokens) else None

    cfg: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text("bos_token_id"),
        "eos_token": text("eos_token_id"),
        "unk_token": text("unknown_token_id"),
        "pad_token": text("padding_token_id"),
        "add_bos_token": bool(
            meta.get("tokenizer.ggml.add_bos_token", meta.get("tokenizer.ggml.model") == "llama")
        ),
        "add_eos_token": bool(meta.get("tokenizer.ggml.add_eos_token", False)),
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(meta.get(f"{arch}.context_length", 2048)),
    }
    cfg = {k: v for k, v in cfg.items() if v is not None}
    template = meta.get("tokenizer.chat_template")
    if isinstance(template, str):
        cfg["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    stops = sorted(GgufTokenizer.from_metadata(meta).stop_ids)
    if stops:
        eos = meta.get("tokenizer.ggml.eos_token_id")
        stops = ([eos] if eos in stops else []) + [s for s in stops if s != eos]
        gen["eos_token_id"] = stops if len(stops) > 1 else stops[0]


def convert(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    type: str | GgufType | HfType | None = None,
    force: bool = False,
    progress: bool | None = None,
) -> ConvertResult:
    """``src`` a Hugging Face directory -> the GGUF file ``dest`` (:func:`hf_to_gguf`,
    ``type`` default f16); ``src`` a GGUF file -> the Hugging Face directory ``dest``
    (:func:`gguf_to_hf`, ``type`` default f32). InputError for a missing ``src``."""
    s = Path(src)
    if s.is_dir():
        to_gguf = GgufType.F16 if type is None else type
        if isinstance(to_gguf, HfType):
            to_gguf = to_gguf.value
        return hf_to_gguf(s, dest, to_gguf, force, progress)
    if s.is_file():
        to_hf = HfType.F32 if type is None else type
        if isinstance(to_hf, GgufType):
            to_hf = to_hf.value
        return gguf_to_hf(s, dest, to_hf, force, progress)
    raise InputError(
        f"{s} does not exist (expected a Hugging Face model directory or a .gguf file)"
    )
