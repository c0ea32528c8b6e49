"""``rlx serve MODEL [MODEL ...]``: the OpenAI-compatible HTTP server (:mod:`rlx.serve`)
on uvicorn. SIGTERM (or Ctrl-C) drains: new requests get 503, running ones finish (at
most ``--drain-timeout`` seconds), then the process exits 0; a second signal stops at
once. A model that fails to load stops the server with exit status 1."""

from __future__ import annotations

import logging
import time
from types import FrameType
from typing import TYPE_CHECKING, Any

import click

from rlx.cli import serve_ray
from rlx.cli.common import CONTEXT, precision_option, status, threads_option

if TYPE_CHECKING:
    from rlx.serve.config import ServeConfig

__all__ = ["command", "serve"]

log = logging.getLogger("uvicorn.error")


def _server(app: Any, config: ServeConfig, log_level: str) -> Any:
    """A uvicorn server whose first SIGTERM / SIGINT drains instead of stopping."""
    import uvicorn

    class DrainingServer(uvicorn.Server):
        drain_started: float | None = None
        failed = False

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.drain_started is not None or not self.started:
                super().handle_exit(sig, frame)  # a second signal: stop now
                self.force_exit = self.drain_started is not None
                return
            log.info("signal %d: draining (new requests get 503)", sig)
            app.state.gate.close()
            self.drain_started = time.monotonic()

        async def on_tick(self, counter: int) -> bool:
            for s in app.state.services.values():
                err = getattr(s, "load_error", None)
                if err is not None and not self.failed:
                    log.error("model %s failed to load: %s", s.id, err)
                    self.failed = self.should_exit = True
            if self.drain_started is not None and not self.should_exit:
                waited = time.monotonic() - self.drain_started
                if app.state.gate.idle() or waited > config.drain_timeout_s:
                    self.should_exit = True
            return await super().on_tick(counter)

    cfg = uvicorn.Config(
        app,
        host=config.host,
        port=config.port,
        log_level=log_level,
        timeout_graceful_shutdown=int(config.drain_timeout_s) + 1,
        access_log=log_level == "debug",
    )
    return DrainingServer(cfg)


def serve(models: list[str], config: ServeConfig, log_level: str = "info") -> int:
    """Load ``models`` and serve them until SIGTERM; the exit status."""
    from rlx.serve import require

    require(what="rlx serve")
    from rlx.serve import create_app, load_services

    services = load_services(models, config)
    app = create_app(services, config)
    names = ", ".join(s.id for s in services)
    status(f"serving {names} on http://{config.host}:{config.port} (loading; see /health)")
    server = _server(app, config, log_level)
    server.run()
    return 1 if server.failed else 0


@click.command(
    "serve",
    context_settings=CONTEXT,
    short_help="An OpenAI-compatible HTTP server (embeddings, completions, chat).",
)
@click.argument("models", nargs=-1, required=True)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option(
    "--api-key",
    envvar="RLX_API_KEY",
    default=None,
    help="Require 'Authorization: Bearer KEY' on /v1/ (or set RLX_API_KEY).",
)
@click.option(
    "--max-batch", type=click.IntRange(min=1), default=32, show_default=True,
    help="Rows per embedding batch.",
)  # fmt: skip
@click.option(
    "--max-batch-tokens", type=click.IntRange(min=1), default=8192, show_default=True,
    help="Padded tokens per embedding batch.",
)  # fmt: skip
@click.option(
    "--max-wait-ms", type=click.FloatRange(min=0), default=5.0, show_default=True,
    help="How long a batch waits for more rows.",
)  # fmt: skip
@click.option(
    "--parallel", type=click.IntRange(min=1), default=4, show_default=True,
    help="Sequences generated at once (KV-cache slots).",
)  # fmt: skip
@click.option(
    "--ctx", type=click.IntRange(min=1), default=2048, show_default=True,
    help="Context length of generation models (tokens).",
)  # fmt: skip
@precision_option()
@threads_option()
@click.option(
    "--workers", type=click.IntRange(min=1), default=None,
    help="Embedding batches run at once per model, sharing --threads "
    "(default: 2 when --threads >= 2, else 1; int8: 1).",
)  # fmt: skip
@click.option(
    "--max-queue", type=click.IntRange(min=1), default=256, show_default=True,
    help="Requests waiting per model before 429.",
)  # fmt: skip
@click.option(
    "--max-body-bytes", type=click.IntRange(min=1), default=1 << 20, show_default=True,
    help="Largest request body (413 above).",
)  # fmt: skip
@click.option(
    "--max-inputs", type=click.IntRange(min=1), default=2048, show_default=True,
    help="Texts per embedding request.",
)  # fmt: skip
@click.option(
    "--max-prompt-tokens", type=click.IntRange(min=1), default=None,
    help="Tokens a generation prompt may hold (default: --ctx).",
)  # fmt: skip
@click.option(
    "--max-tokens-limit", type=click.IntRange(min=1), default=4096, show_default=True,
    help="Largest max_tokens a request may ask for.",
)  # fmt: skip
@click.option(
    "--chat-template", type=click.Path(exists=True), default=None,
    help="Chat template for GGUF models: a .jinja file or a tokenizer_config.json "
    "(default: each file's own).",
)  # fmt: skip
@click.option(
    "--drain-timeout", type=click.FloatRange(min=0), default=30.0, show_default=True,
    help="Seconds running requests get to finish after SIGTERM.",
)  # fmt: skip
@click.option(
    "--log-level",
    type=click.Choice(["critical", "error", "warning", "info", "debug"]),
    default="info",
    show_default=True,
)
@serve_ray.options
def command(
    models: tuple[str, ...],
    host: str,
    port: int,
    api_key: str | None,
    max_batch: int,
    max_batch_tokens: int,
    max_wait_ms: float,
    parallel: int,
    ctx: int,
    precision: str,
    threads: int | None,
    workers: int | None,
    max_queue: int,
    max_body_bytes: int,
    max_inputs: int,
    max_prompt_tokens: int | None,
    max_tokens_limit: int,
    chat_template: str | None,
    drain_timeout: float,
    log_level: str,
    use_ray: bool,
    replicas: int,
    cpus_per_replica: float,
    ray_address: str | None,
) -> int:
    """Serve MODELs over HTTP with the OpenAI API: each an HF sentence-embedding
    directory, a .gguf file or a known name (all-MiniLM-L6-v2), optionally as ID=MODEL.

    \b
    Examples:
      rlx serve all-MiniLM-L6-v2
      curl -s localhost:8000/v1/embeddings -H 'Content-Type: application/json' \\
        -d '{"model": "all-MiniLM-L6-v2", "input": "A man plays a guitar."}'
      rlx serve mini=./my-encoder ./llama.gguf --port 8080 --api-key secret
      rlx serve --ray --replicas 4 all-MiniLM-L6-v2

    See docs/serving.md for the endpoints, limits and metrics.
    """
    from rlx.serve.config import Precision, ServeConfig

    config = ServeConfig(
        host=host, port=port, api_key=api_key, max_batch=max_batch,
        max_batch_tokens=max_batch_tokens, max_wait_ms=max_wait_ms, parallel=parallel, ctx=ctx,
        precision=Precision(precision), max_body_bytes=max_body_bytes, max_queue=max_queue,
        max_inputs=max_inputs, max_prompt_tokens=max_prompt_tokens,
        max_tokens_limit=max_tokens_limit, num_threads=threads, workers=workers, drain_timeout_s=drain_timeout,
        chat_template=chat_template,
    )  # fmt: skip
    if use_ray:
        return serve_ray.run(
            list(models), config, replicas=replicas, cpus=cpus_per_replica, address=ray_address
        )
    return serve(list(models), config, log_level)
