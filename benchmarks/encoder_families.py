"""The new encoder families and rerankers: rlx ``SentenceEncoder.encode`` against
sentence-transformers' ``SentenceTransformer.encode`` (``reranker``: rlx
``Reranker.predict`` against ``CrossEncoder.predict`` on (query, text) pairs) on the same
texts, batch and thread count (issue 34's target: rlx <= 0.8x sentence-transformers' time).

    .venv/bin/python benchmarks/encoder_families.py [--families modernbert qwen3 reranker]
        [--threads 1] [--texts 64] [--batch 32] [--rounds 5] [--layers 4]

Models are random-weight checkpoints written by transformers into a temp dir at the
published widths (ModernBERT-base: hidden 768, 12 heads, GLU 1152, local window 128;
Qwen3-Embedding-0.6B: hidden 1024, 16 / 8 heads of 128, FFN 3072; the reranker a
BertForSequenceClassification at ms-marco-MiniLM-L-6-v2's widths: hidden 384, 12 heads,
FFN 1536, one label) but ``--layers`` layers, with a word-level tokenizer over a generated vocabulary (truncation at 512). The
texts are ``--texts`` generated sentences of 8-200 words. The two engines run in this
process, one after the other in each round (the order alternating), after one untimed
encode each; reported: the median seconds over the rounds, the ratio rlx / ST, and the
max abs difference of the embeddings. NomicBERT has no sentence-transformers run (its
modeling code is remote code, not installed).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

VOCAB = [f"w{i}" for i in range(2000)]


def _tokenizer(out: Path, cls_sep: bool) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]
    vocab = {t: i for i, t in enumerate(special + VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    single = "[CLS] $A [SEP]" if cls_sep else "$A [SEP]"
    tok.post_processor = processors.TemplateProcessing(
        single=single, special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    tok.enable_truncation(512)
    raw = out / "raw.json"
    tok.save(str(raw))
    PreTrainedTokenizerFast(
        tokenizer_file=str(raw), model_max_length=512, pad_token="[PAD]", unk_token="[UNK]",
        cls_token="[CLS]", sep_token="[SEP]", model_input_names=["input_ids", "attention_mask"],
    ).save_pretrained(str(out))  # fmt: skip
    raw.unlink()


def _build(family: str, root: Path, layers: int) -> Path:
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    torch.manual_seed(0)
    vocab = len(VOCAB) + 4
    if family == "reranker":
        cfg = transformers.BertConfig(
            vocab_size=vocab, hidden_size=384, intermediate_size=1536, num_hidden_layers=layers,
            num_attention_heads=12, max_position_embeddings=512, num_labels=1,
        )  # fmt: skip
        out = root / family
        transformers.BertForSequenceClassification(cfg).eval().save_pretrained(str(out))
        _tokenizer(out, cls_sep=True)
        return out
    if family == "modernbert":
        cfg = transformers.ModernBertConfig(
            vocab_size=vocab, hidden_size=768, intermediate_size=1152, num_hidden_layers=layers,
            num_attention_heads=12, max_position_embeddings=1024, pad_token_id=0,
            bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3,
        )  # fmt: skip
        model, pooling = transformers.ModernBertModel(cfg), "mean"
    else:
        cfg = transformers.Qwen3Config(
            vocab_size=vocab, hidden_size=1024, intermediate_size=3072, num_hidden_layers=layers,
            num_attention_heads=16, num_key_value_heads=8, head_dim=128,
            max_position_embeddings=1024,
        )  # fmt: skip
        model, pooling = transformers.Qwen3Model(cfg), "lasttoken"
    hf = root / f"{family}_hf"
    model.save_pretrained(str(hf))
    _tokenizer(hf, cls_sep=family == "modernbert")
    first = Transformer(str(hf), max_seq_length=512)
    mods = [first, Pooling(first.get_embedding_dimension(), pooling), Normalize()]
    out = root / family
    SentenceTransformer(modules=mods, device="cpu").save(str(out))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=["modernbert", "qwen3", "reranker"])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    a = ap.parse_args()

    import numpy as np
    import torch
    from sentence_transformers import CrossEncoder, SentenceTransformer

    from rlx.models import Reranker, SentenceEncoder

    torch.set_num_threads(a.threads)
    rng = random.Random(0)
    texts = [" ".join(rng.choices(VOCAB, k=rng.randint(8, 200))) for _ in range(a.texts)]
    pairs = [(" ".join(rng.choices(VOCAB, k=rng.randint(3, 12))), t) for t in texts]
    print(f"load average {os.getloadavg()}, threads {a.threads}, {a.texts} texts, "
          f"batch {a.batch}, {a.layers} layers")  # fmt: skip
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for fam in a.families:
            d = _build(fam, Path(tmp), a.layers)
            if fam == "reranker":
                ce, rr = CrossEncoder(str(d), device="cpu"), Reranker(d, num_threads=a.threads)
                runs = {
                    "st": lambda ce=ce: np.asarray(ce.predict(pairs, batch_size=a.batch)),
                    "rlx": lambda rr=rr: rr.predict(pairs, batch_size=a.batch),
                }
            else:
                st = SentenceTransformer(str(d), device="cpu")
                enc = SentenceEncoder(d, num_threads=a.threads)
                runs = {
                    "st": lambda st=st: st.encode(texts, batch_size=a.batch),
                    "rlx": lambda enc=enc: enc.encode(texts, batch_size=a.batch),
                }
            outs = {k: f() for k, f in runs.items()}  # untimed: plans, caches
            diff = float(np.abs(outs["st"] - outs["rlx"]).max())
            times: dict[str, list[float]] = {"st": [], "rlx": []}
            for r in range(a.rounds):
                for k in ("st", "rlx") if r % 2 == 0 else ("rlx", "st"):
                    t0 = time.perf_counter()
                    runs[k]()
                    times[k].append(time.perf_counter() - t0)
                    time.sleep(0.05)
            st_s, rlx_s = statistics.median(times["st"]), statistics.median(times["rlx"])
            rows.append({"family": fam, "st_s": st_s, "rlx_s": rlx_s, "ratio": rlx_s / st_s,
                         "max_abs_diff": diff})  # fmt: skip
            print(json.dumps(rows[-1]))
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
