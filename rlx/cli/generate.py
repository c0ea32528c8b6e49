"""``rlx generate MODEL PROMPT``: text from a decoder language model. In: a GGUF file or a
Hugging Face directory (config.json + safetensors + tokenizer.json) and a prompt (``-``: read it from stdin). Out: the generated text on stdout as it is made
(streamed), then one line on stderr with the prefill and decode tokens/s. ``--draft PATH``
(a draft model of the same tokenizer) or ``--draft ngram`` (prompt lookup) decodes
speculatively, ``--num-draft`` tokens per target run; the stderr line then gives the
tokens per target run and the accepted / drafted tokens, and ``--verbose`` the accepted
tokens of every run."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from rlx.cli.common import CONTEXT, threads_option

__all__ = ["command"]


@click.command(
    "generate",
    context_settings=CONTEXT,
    short_help="Generate text with a GGUF / Hugging Face language model (streamed, tokens/s).",
)
@click.argument("model", type=click.Path(path_type=Path))
@click.argument("prompt")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option(
    "--temperature", type=click.FloatRange(min=0.0), default=0.0, show_default=True,
    help="0 is greedy.",
)  # fmt: skip
@click.option("--top-k", type=click.IntRange(min=0), default=0, help="0: no limit.")
@click.option("--top-p", type=click.FloatRange(0.0, 1.0, min_open=True), default=1.0)
@click.option("--seed", type=int, default=None, help="Seed of the sampler (reproducible).")
@click.option("--stop", multiple=True, help="A stop string (repeatable).")
@click.option(
    "--max-context", type=click.IntRange(min=2), default=None,
    help="KV cache positions (default: 2048, or the model's context length when smaller).",
)  # fmt: skip
@click.option(
    "--kv-dtype", type=click.Choice(["f32", "bf16", "f16", "int8"]), default="f32", show_default=True,
    help="KV cache precision (bf16 / f16: half the cache memory; int8: a quarter + scales).",
)  # fmt: skip
@click.option(
    "--precision", default=None, metavar="NAME",
    help="Quantize a Hugging Face directory's weights while loading: int8 / int4 (rlx's "
    "Int8Block / Int4Block) or a GGUF type (q8_0, q6_k, q5_k, q5_0, q5_1, q4_k, q4_0, "
    "q4_1); the logit error against the unquantized weights on the prompt is printed on "
    "stderr.",
)  # fmt: skip
@click.option(
    "--kv-group", type=click.IntRange(min=0), default=0, show_default=True,
    help="int8 KV cache: one scale per this many values of a head (0: one per head).",
)  # fmt: skip
@click.option(
    "--draft",
    default=None,
    metavar="PATH|ngram",
    help="Speculative decoding: a draft model (GGUF / HF directory, same tokenizer) or "
    "'ngram' (prompt lookup, no second model). Greedy text is unchanged.",
)
@click.option(
    "--num-draft",
    type=click.IntRange(1, 16),
    default=4,
    show_default=True,
    help="Tokens drafted per target run (with --draft).",
)
@click.option("--verbose", is_flag=True, help="With --draft: the accepted tokens of every run.")
@threads_option()
def command(
    model: Path,
    prompt: str,
    max_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    seed: int | None,
    stop: tuple[str, ...],
    max_context: int | None,
    kv_dtype: str,
    precision: str | None,
    kv_group: int,
    draft: str | None,
    num_draft: int,
    verbose: bool,
    threads: int | None,
) -> None:
    """Generate up to --max-tokens tokens after PROMPT with MODEL (a GGUF file or a
    Hugging Face directory)."""
    import rlx.models.llm as llm

    if prompt == "-":
        prompt = sys.stdin.read()
    m = llm.load(
        model, max_context=max_context, num_threads=threads, kv_dtype=kv_dtype,
        precision=precision, kv_group=kv_group,
    )  # fmt: skip
    drafter: object = None
    if draft == "ngram":
        drafter = "ngram"
    elif draft is not None:
        drafter = llm.load(draft, max_context=m.max_context, num_threads=threads)
    stream = m.generate(
        prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        seed=seed,
        stop=stop,
        stream=True,
        draft=drafter,
        num_draft=num_draft,
    )
    for piece in stream:
        click.echo(piece, nl=False)
        sys.stdout.flush()
    click.echo()
    sys.stdout.flush()
    r = stream.result
    assert r is not None
    click.echo(f"[{r.finish_reason}] {r.stats}", err=True)
    if m.quantization is not None:
        err = m.quantization_error(r.prompt_ids)
        click.echo(
            f"[precision] {m.quantization.summary()}; logits after the prompt vs the "
            f"unquantized weights: max |diff| / max |logit| = {err.rel:.3g}, rms "
            f"{err.rms:.3g}, same greedy token: {err.same_argmax}",
            err=True,
        )
    if verbose and r.stats.accepted:
        runs = " ".join(f"{a}/{d}" for a, d in zip(r.stats.accepted, r.stats.drafted, strict=True))
        click.echo(f"accepted/drafted per target run: {runs}", err=True)
