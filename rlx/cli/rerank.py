"""``rlx rerank MODEL QUERY [DOC ...]``: score documents against a query with a
cross-encoder. In: a ``...ForSequenceClassification`` model directory, a query, documents
as arguments and/or a file of one document per line (``-``: stdin; blank lines skipped).
Out: the documents best first with their scores on stdout (``--json``: a JSON list of
``{corpus_id, score, text}``, as ``CrossEncoder.rank(..., return_documents=True)``).
Status lines go to stderr."""

from __future__ import annotations

import json
import time
from typing import IO, Any

import click

from rlx.cli.common import CONTEXT, model_dir, precision_option, status, threads_option
from rlx.cli.embed import read_texts

__all__ = ["command", "format_ranking"]


def format_ranking(ranked: list[dict[str, Any]], width: int = 70) -> str:
    """One line per document: rank, score, its index in the input and its text (cut to
    ``width`` characters)."""
    lines = []
    for i, r in enumerate(ranked, 1):
        text = str(r.get("text", ""))
        short = text if len(text) <= width else text[: width - 3] + "..."
        lines.append(f"{i:>3}. {r['score']:+.6f}  #{r['corpus_id']:<4} {short}")
    return "\n".join(lines)


@click.command(
    "rerank",
    context_settings=CONTEXT,
    short_help="Rank documents against a query with a cross-encoder.",
)
@click.argument("model")
@click.argument("query")
@click.argument("docs", nargs=-1)
@click.option(
    "--docs-file",
    "-f",
    "docs_file",
    type=click.File("r", encoding="utf-8"),
    help="Read documents from this file, one per line ('-' for stdin).",
)
@click.option(
    "--top-k",
    type=click.IntRange(min=1),
    default=None,
    help="Show only the best K documents (default: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list {corpus_id, score, text}.")
@precision_option()
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True)
@threads_option()
def command(
    model: str,
    query: str,
    docs: tuple[str, ...],
    docs_file: IO[str] | None,
    top_k: int | None,
    as_json: bool,
    precision: str,
    batch_size: int,
    threads: int | None,
) -> int:
    """Rank documents by their relevance to QUERY with a cross-encoder MODEL (a
    BERT / RoBERTa / XLM-R / DistilBERT ...ForSequenceClassification directory, such as
    cross-encoder/ms-marco-MiniLM-L6-v2 or BAAI/bge-reranker-base downloaded). Scores
    are those of sentence-transformers' CrossEncoder (sigmoid for one-label models unless
    the checkpoint's config names another activation).

    \b
    Examples:
      rlx rerank ./ms-marco-MiniLM-L6-v2 "how do cats sleep" "Cats sleep 16 hours." "Dogs bark."
      rlx rerank ./bge-reranker-base "query" --docs-file docs.txt --top-k 5 --json
    """
    items = read_texts(docs, docs_file)
    if not items:
        raise click.UsageError("no document given: pass DOC arguments or --docs-file FILE")
    from rlx.models import Reranker

    path = model_dir(model)
    status(f"loading {path} and compiling ...")
    t0 = time.perf_counter()
    rr = Reranker(path, precision=precision, num_threads=threads)
    status(f"ready in {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    ranked = rr.rank(query, items, top_k=top_k, return_documents=True, batch_size=batch_size)
    dt = time.perf_counter() - t0
    if as_json:
        click.echo(json.dumps(ranked, ensure_ascii=False))
    else:
        click.echo(format_ranking(ranked))
    status(f"scored {len(items)} document(s) in {dt * 1e3:.1f} ms (precision {precision})")
    return 0
