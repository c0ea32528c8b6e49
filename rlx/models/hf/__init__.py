"""Hugging Face encoder checkpoints (and Qwen2 / Qwen3 decoders used as embedders). In: a
local model directory (``config.json``,
``model.safetensors`` or shards with ``model.safetensors.index.json``, ``tokenizer.json``).
Out: :class:`HFModel`: the encoder as a GraphModule (symbolic batch and seq), its params,
a tokenizer and the parsed config, with :meth:`HFModel.compile` to get a CompiledGraph.

Everything is read and checked before anything is built (see ``config.py``,
``weights.py``): an unsupported architecture or config value, a missing file, a missing,
extra or misshapen tensor is a :class:`~rlx.errors.ModelError` naming it. Needs the
``hf`` extra (``pip install 'rlx[hf]'``: safetensors and tokenizers).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from rlx.errors import ModelError
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule
from rlx.models.hf.arch import build_encoder, encoder_graph
from rlx.models.hf.config import (
    CLASSIFIER_ARCHITECTURES,
    SUPPORTED_ARCHITECTURES,
    EncoderConfig,
    Family,
    Task,
    read_config,
    read_json,
)
from rlx.models.hf.samples import CALIBRATION_TEXTS
from rlx.models.hf.tokenizer import Tokenizer, check_texts
from rlx.models.hf.weights import load_weights

__all__ = [
    "load",
    "HFModel",
    "EncoderConfig",
    "Family",
    "Tokenizer",
    "SUPPORTED_ARCHITECTURES",
    "CLASSIFIER_ARCHITECTURES",
    "Task",
    "PRECISIONS",
    "CALIBRATION_TEXTS",
    "build_encoder",
    "encoder_graph",
]

#: ``precision=`` values: f32, bf16 (AutoMixedBf16 policy), int8 (rlx.quantize on text).
PRECISIONS = ("f32", "bf16", "int8")


def _max_length(model_dir: Path, cfg: EncoderConfig) -> int:
    """The token limit: sentence_bert_config.json's max_seq_length, else tokenizer.json's
    truncation, else tokenizer_config.json's model_max_length, capped by the position
    table."""
    limit = None
    st = model_dir / "sentence_bert_config.json"
    if st.is_file():
        limit = read_json(st, "sentence-transformers config").get("max_seq_length")
    if limit is None and (model_dir / "tokenizer.json").is_file():
        trunc = read_json(model_dir / "tokenizer.json", "tokenizer").get("truncation")
        limit = trunc.get("max_length") if isinstance(trunc, dict) else None
    if limit is None and (model_dir / "tokenizer_config.json").is_file():
        limit = read_json(model_dir / "tokenizer_config.json", "tokenizer config").get(
            "model_max_length"
        )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        limit = cfg.max_positions
    return min(limit, cfg.max_positions)


def check_precision(precision: str) -> str:
    """``precision`` if it is one of :data:`PRECISIONS`, else ModelError listing them."""
    if precision not in PRECISIONS:
        raise ModelError(f"precision {precision!r} is not supported; choose one of {PRECISIONS}")
    return precision


@dataclass(frozen=True)
class HFModel:
    """A loaded encoder. ``module`` outputs the last hidden state [batch, seq, hidden];
    ``params`` maps checkpoint tensor names to arrays (read-only views of the file where
    the dtype allowed); ``max_length`` is the token limit texts are truncated to."""

    path: Path
    config: EncoderConfig
    module: GraphModule
    params: Mapping[str, np.ndarray]
    tokenizer: Tokenizer
    max_length: int
    precision: str = "f32"
    num_threads: int | None = None

    @property
    def graph(self) -> Graph:
        return self.module.into_graph()

    def inputs(self, texts: Sequence[str], pad_to: int | None = None) -> dict[str, np.ndarray]:
        """Tokenized, padded graph inputs for ``texts`` (see :class:`Tokenizer`)."""
        return self.tokenizer.encode(check_texts(texts), pad_to)

    def example_inputs(self, batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Random graph inputs of ``batch`` x ``seq`` tokens (``seq`` <= max_length): valid
        non-pad ids framed like a tokenized text, no padding (for benchmarks)."""
        if not (1 <= batch and 2 <= seq <= self.config.max_positions):
            raise ModelError(
                f"example_inputs: need batch >= 1 and 2 <= seq <= {self.config.max_positions}, "
                f"got batch={batch}, seq={seq}"
            )
        rng = np.random.default_rng(seed)
        pad = self.tokenizer.pad_id
        ids = rng.integers(0, self.config.vocab_size - 1, size=(batch, seq), dtype=np.int64)
        ids[ids >= pad] += 1  # never the pad id
        encs = [(list(row), [0] * seq) for row in ids]
        return self.tokenizer.pad(encs, seq)

    def options(self, precision: str | None = None, **kw: Any) -> Any:
        """The CompileOptions for ``precision`` (default: the model's) and this thread
        count; ``kw`` overrides any field (``num_threads=2`` included)."""
        from rlx.options import CompileOptions
        from rlx.passes.precision import PrecisionPolicy

        p = check_precision(precision or self.precision)
        policy = PrecisionPolicy.AutoMixedBf16 if p == "bf16" else None
        kw.setdefault("max_shape_plans", 16)
        kw.setdefault("num_threads", self.num_threads)
        kw.setdefault("precision", policy)
        return CompileOptions(**kw)

    def compile(self, graph: Graph | None = None, precision: str | None = None, **kw: Any) -> Any:
        """A CompiledGraph of ``graph`` (default: the encoder) at ``precision`` (default:
        the model's) with the params set; ``kw`` overrides CompileOptions fields
        (``freeze_params=True``, ...). int8 quantizes activations per row at run time; use
        :meth:`quantize` for your own text and the accuracy report."""
        p = check_precision(precision or self.precision)
        if p == "int8":
            return self.quantize(graph=graph).compiled
        from rlx.runtime.session import Session

        g = graph if graph is not None else self.graph
        return Session("cpu").compile(g, self.options(p, **kw), params=dict(self.params))

    def quantize(
        self,
        texts: Iterable[str] | None = None,
        graph: Graph | None = None,
        batch_size: int = 8,
        **kw: Any,
    ) -> Any:
        """``rlx.quantize`` of ``graph`` (default: the encoder) evaluated (and, with
        ``activations="static"``, calibrated) on ``texts`` (default:
        :data:`CALIBRATION_TEXTS`) in batches of ``batch_size``; ``kw`` goes to
        ``rlx.quantize`` (``activations=``, ``method=``, ``exclude=``, ...). Activations are
        quantized per row at run time (``activations="dynamic"``) unless ``kw`` says
        otherwise, as :class:`~rlx.models.SentenceEncoder` does. Returns its
        QuantizeResult."""
        from rlx.quant.api import quantize

        sample = check_texts(CALIBRATION_TEXTS if texts is None else texts)
        if not sample:
            raise ModelError("quantize: calibration texts are empty; give at least one sentence")
        batches = [
            self.inputs(sample[i : i + batch_size]) for i in range(0, len(sample), batch_size)
        ]
        g = graph if graph is not None else self.graph
        for b in batches:  # a pooling head that selects tokens: all of them (no prompt)
            if "pooling_mask" in g.input_names:
                b["pooling_mask"] = b["attention_mask"]
        kw.setdefault("eval_batches", len(batches))
        kw.setdefault("rank_layers", False)
        kw.setdefault("activations", "dynamic")
        return quantize(g, batches, params=dict(self.params), options=self.options("f32"), **kw)

    def __repr__(self) -> str:
        c = self.config
        return (
            f"HFModel({c.architecture}, layers={c.num_layers}, hidden={c.hidden_size}, "
            f"heads={c.num_heads}, max_length={self.max_length}, path={str(self.path)!r})"
        )


def load(
    path: str | Path,
    precision: str = "f32",
    num_threads: int | None = None,
    *,
    task: Task = Task.EMBED,
) -> HFModel:
    """Load the Hugging Face encoder in directory ``path`` (see the module docstring).
    ``task=Task.RERANK`` loads a ``...ForSequenceClassification`` checkpoint: the params
    then hold its classification head too (``module`` is still the bare encoder)."""
    model_dir = Path(path)
    if not model_dir.is_dir():
        raise ModelError(f"model directory {str(model_dir)!r} does not exist or is not a directory")
    check_precision(precision)
    cfg = read_config(model_dir, task)
    max_len = _max_length(model_dir, cfg)
    tok = Tokenizer(
        model_dir / "tokenizer.json", max_len, cfg.pad_token_id, token_types=cfg.type_vocab_size > 0
    )
    if cfg.family.is_decoder:  # causal: right padding needs no padding mask (decoder.py)
        tok.pad_left = False
    params = load_weights(model_dir, cfg)
    module = GraphModule.from_graph(encoder_graph(cfg, cfg.architecture))
    return HFModel(
        path=model_dir,
        config=cfg,
        module=module,
        params=MappingProxyType(params),
        tokenizer=tok,
        max_length=max_len,
        precision=precision,
        num_threads=num_threads,
    )
