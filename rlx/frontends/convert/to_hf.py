"""GGUF file -> Hugging Face directory (:func:`gguf_to_hf`): config.json,
generation_config.json, model.safetensors and the tokenizer files transformers loads."""

from __future__ import annotations

import json
import os
import shutil
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.frontends.convert.common import (
    _BYTE,
    _CONTROL,
    _NORMAL,
    _UNUSED,
    _USER_DEFINED,
    SUPPORTED_ARCHITECTURES,
    ConvertResult,
    HfType,
    _bar,
    _check_destination,
    _parse_type,
    _unpermute,
)

#: the Gemma architectures: Gemma's tensor names, norms stored as 1 + w, gemma config keys
_GEMMA = ("gemma2", "gemma3")

# ---- GGUF -> HF ---------------------------------------------------------------------


def _hf_names(arch: str) -> dict[str, str]:
    """GGUF tensor name (``blk.{i}.`` as ``blk.#.``) -> transformers' name."""
    from rlx.models.llm.hf import _LAYER, _LAYER_GEMMA, _LAYER_PLAIN, _TOP

    out = {g: h for h, g in _TOP.items()}
    layer = {**_LAYER, **(_LAYER_GEMMA if arch in _GEMMA else _LAYER_PLAIN)}
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
        "gemma2": ("Gemma2ForCausalLM", "gemma2"),
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
    if a in _GEMMA:
        out.update(
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=round(1.0 / cfg.attn_scale**2),
            sliding_window=cfg.sliding_window or None,
            layer_types=[
                "sliding_attention" if cfg.is_sliding(i) else "full_attention"
                for i in range(cfg.num_layers)
            ],
            final_logit_softcapping=cfg.logit_softcap,
            attn_logit_softcapping=cfg.attn_softcap,
        )
        if a == "gemma3":
            out["rope_local_base_freq"] = cfg.arch.rope_base_local
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
        if a in _GEMMA and hf.endswith("norm.weight"):  # the file holds 1 + w
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
