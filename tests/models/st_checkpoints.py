"""Tiny random checkpoints written by transformers and sentence-transformers themselves, for
the tests that compare rlx with ``CrossEncoder`` and ``SentenceTransformer``. In: a family
("bert", "roberta", "xlm-roberta", "distilbert"), a directory. Out: that directory, loadable
by both libraries and by rlx.

The tokenizer is the word-level one of tests/models/tiny_checkpoints.py (built with the
``tokenizers`` library, truncating at ``MAX_LEN`` tokens) wrapped as transformers'
``PreTrainedTokenizerFast`` so ``AutoTokenizer`` reads it. Weights are torch's default init
redrawn with a larger spread (seeded), so scores of different pairs differ clearly.
"""

from __future__ import annotations

from pathlib import Path

from tests.models import tiny_checkpoints as tc

__all__ = ["CLASSIFIERS", "PAIRS", "classifier", "sentence_transformer", "tokenizer"]

#: family -> the transformers class name of its sequence classifier.
CLASSIFIERS = {
    "bert": "BertForSequenceClassification",
    "roberta": "RobertaForSequenceClassification",
    "xlm-roberta": "XLMRobertaForSequenceClassification",
    "distilbert": "DistilBertForSequenceClassification",
}

#: (query, document) pairs of mixed lengths; the last is longer than MAX_LEN tokens together.
PAIRS = [
    ("the cat", "the cat sat on the mat"),
    ("the cat", "a dog runs"),
    ("music", "music is playing in the park"),
    ("hello", "hello"),
    ("a dog runs in the park", tc.SENTENCES[3]),
]


def _base(family: str) -> str:
    return "roberta" if family == "xlm-roberta" else family


def tokenizer(family: str, out_dir: Path, token_types: bool | None = None) -> None:
    """tokenizer.json + tokenizer_config.json for ``family`` in ``out_dir``. The tokenizer
    gives transformers ``token_type_ids`` when ``token_types`` (default: for BERT, as
    BertTokenizer does); otherwise ``model_input_names`` leaves them out."""
    from transformers import PreTrainedTokenizerFast

    raw = out_dir / "raw_tokenizer.json"
    tc._tokenizer(_base(family), raw)
    if _base(family) == "roberta":  # RoBERTa's pair template: <s> A </s> </s> B </s>, types 0
        from tokenizers import Tokenizer, processors

        t = Tokenizer.from_file(str(raw))
        vocab = t.get_vocab()
        t.post_processor = processors.TemplateProcessing(
            single="<s> $A </s>",
            pair="<s> $A </s> </s> $B </s>",
            special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
        )
        t.save(str(raw))
    if _base(family) == "roberta":
        names = {"bos_token": "<s>", "eos_token": "</s>", "cls_token": "<s>", "sep_token": "</s>"}
        names |= {"pad_token": "<pad>", "unk_token": "<unk>"}
    else:
        names = {"cls_token": "[CLS]", "sep_token": "[SEP]", "pad_token": "[PAD]"}
        names |= {"unk_token": "[UNK]"}
    types = family == "bert" if token_types is None else token_types
    inputs = ["input_ids", *(["token_type_ids"] if types else []), "attention_mask"]
    tok = PreTrainedTokenizerFast(
        tokenizer_file=str(raw), model_max_length=tc.MAX_LEN, model_input_names=inputs, **names
    )
    tok.save_pretrained(str(out_dir))
    raw.unlink()


def _config(family: str, **extra: object) -> object:
    import transformers

    cfg = {k: v for k, v in tc.config(_base(family)).items() if k != "architectures"}
    cls = {
        "bert": "BertConfig",
        "roberta": "RobertaConfig",
        "xlm-roberta": "XLMRobertaConfig",
        "distilbert": "DistilBertConfig",
    }[family]
    if family == "xlm-roberta":
        cfg["model_type"] = "xlm-roberta"
    cfg.pop("model_type")
    return getattr(transformers, cls)(**cfg, **extra)


def _spread(model: object, seed: int) -> None:
    import torch

    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():  # type: ignore[attr-defined]
            if p.ndim >= 2:
                p.normal_(0.0, 1.0 / p.shape[-1] ** 0.5)
            elif "LayerNorm" in name or "layer_norm" in name:
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.3)


def classifier(
    family: str,
    out_dir: Path,
    num_labels: int = 1,
    seed: int = 0,
    token_types: bool | None = None,
    **extra: object,
) -> Path:
    """A ``...ForSequenceClassification`` checkpoint with ``num_labels`` outputs (``extra``
    goes to the config, e.g. ``sbert_ce_default_activation_function``; ``token_types`` to
    :func:`tokenizer`); returns ``out_dir``."""
    import torch
    import transformers

    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = getattr(transformers, CLASSIFIERS[family])(
        _config(family, num_labels=num_labels, **extra)
    )
    _spread(model, seed)
    model.eval()
    model.save_pretrained(str(out_dir))
    tokenizer(family, out_dir, token_types)
    return out_dir


def sentence_transformer(
    out_dir: Path,
    pooling: str,
    family: str = "bert",
    normalize: bool = False,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
    seed: int = 0,
    include_prompt: bool = True,
) -> Path:
    """A SentenceTransformer (Transformer + Pooling(``pooling``) [+ Normalize]) over a tiny
    random ``family`` encoder, saved by sentence-transformers into ``out_dir`` (with
    ``include_prompt=False`` the Pooling module leaves prompt tokens out)."""
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    hf_dir = out_dir.parent / f"{out_dir.name}_hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cls = {"bert": "BertModel", "roberta": "RobertaModel", "xlm-roberta": "XLMRobertaModel"}
    cls["distilbert"] = "DistilBertModel"
    model = getattr(transformers, cls[family])(_config(family))
    _spread(model, seed)
    model.save_pretrained(str(hf_dir))
    tokenizer(family, hf_dir)
    first = Transformer(str(hf_dir), max_seq_length=tc.MAX_LEN)
    mods = [first, Pooling(first.get_embedding_dimension(), pooling, include_prompt)]
    if normalize:
        mods.append(Normalize())
    st = SentenceTransformer(
        modules=mods, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name
    )
    st.save(str(out_dir))
    return out_dir
