"""``/v1/completions`` and ``/v1/chat/completions``: a :class:`GenerationService` serving
one GGUF language model (:mod:`rlx.models.llm`) with continuous batching.

A request goes: body checked (:mod:`rlx.serve.gen_schema`, 400 naming the field) ->
prompt (completions: the text encoded as ``generate()`` encodes it, or token ids as
given; chat: the messages rendered by the model's chat template,
:mod:`rlx.serve.templates`, then encoded without a second BOS; no template or a template
that fails: 400) -> limits (``max_prompt_tokens``, ``max_tokens_limit``, the context
``ctx``: 400 naming the limit) -> the scheduler (:mod:`rlx.serve.scheduler`; a full queue:
429 with ``Retry-After``) -> one JSON answer, or with ``stream`` server-sent events in
OpenAI's chunk schema (``data: {...}`` per piece, a last chunk with ``finish_reason``, a
usage chunk when ``stream_options.include_usage``, then ``data: [DONE]``). A client that
goes away (a closed stream, or a dropped connection while waiting for a JSON answer)
cancels its request, which frees its KV slot before the next decode step.

``usage.completion_tokens`` counts the new tokens (a stop token is not counted, as
``Generation.token_ids``); logprobs are the f32 log-softmax of the logits the token was
drawn from, with the ``top_logprobs`` most likely tokens.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from rlx.errors import InputError, ServeError
from rlx.models.llm.sampling import SamplingParams
from rlx.serve.config import ServeConfig
from rlx.serve.errors import ApiError
from rlx.serve.gen_schema import GenParams, chat_messages, completion_prompt, params
from rlx.serve.scheduler import (
    Event,
    FinishReason,
    GenRequest,
    QueueFull,
    Scheduler,
    Ticket,
    TokenLogprob,
)
from rlx.serve.service import Endpoint, ServiceKind, disconnected
from rlx.serve.templates import ChatTemplate, TemplateError

if TYPE_CHECKING:
    from rlx.models.llm import LlmModel
    from rlx.serve.metrics import Metrics

__all__ = ["GenerationService", "load_model"]

log = logging.getLogger("rlx.serve")


#: The single-sequence KV cache of a model loaded to be served (its BatchedDecoder holds
#: the slots that serve; the model's own cache is never used, so it is kept small).
_OWN_CONTEXT = 8


def load_model(path: str | Path, config: ServeConfig) -> tuple[LlmModel, int]:
    """The GGUF model (or Hugging Face directory) at ``path`` (with a small cache of its
    own) and the context its slots get: ``config.ctx``, at most the model's context
    length."""
    import rlx.models.llm as llm
    from rlx.frontends import gguf

    if Path(path).is_dir():
        from rlx.models.llm.hf import open_checkpoint

        length = open_checkpoint(path).config.context_length
    else:
        f = gguf.load(path)
        length = llm.read_config(f.architecture, f.metadata, f.tensors).context_length
    ctx = min(config.ctx, length)
    ctx = max(ctx, 2)
    own = min(_OWN_CONTEXT, ctx)
    return llm.load(path, max_context=own, num_threads=config.num_threads), ctx


class GenerationService:
    """Serves completions and chat for ``model`` (an LlmModel, or a GGUF path loaded in
    a thread when the app starts) as ``id``, with ``config.parallel`` KV slots of
    ``config.ctx`` positions. ``chat_template``: the template to use (None: the file at
    ``config.chat_template``, else the GGUF file's ``tokenizer.chat_template``; a model
    with none answers chat requests with 400)."""

    kind = ServiceKind.GENERATION
    endpoints = frozenset({Endpoint.COMPLETIONS, Endpoint.CHAT})

    def __init__(
        self,
        model: LlmModel | str | Path,
        id: str,
        config: ServeConfig,
        chat_template: ChatTemplate | None = None,
    ) -> None:
        self.id = id
        self.config = config
        self.created = int(time.time())
        self.model: LlmModel | None = None
        self._path: Path | None = None
        if isinstance(model, (str, Path)):
            self._path = Path(model)
        else:
            self.model = model
        if chat_template is None and config.chat_template is not None:
            chat_template = ChatTemplate.from_path(config.chat_template)  # fails fast
            self._template_path: str | None = config.chat_template
        else:
            self._template_path = None
        self._template = chat_template
        self.template: ChatTemplate | None = None
        self.scheduler: Scheduler | None = None
        self.load_error: BaseException | None = None
        self._metrics: Metrics | None = None
        self._loading: asyncio.Future[None] | None = None

    # ---- the Service protocol --------------------------------------------------------

    def ready(self) -> bool:
        return self.scheduler is not None

    async def start(self, metrics: Metrics) -> None:
        self._metrics = metrics
        metrics.queue_depth.labels(self.id).set(0)
        metrics.kv_slots_in_use.labels(self.id).set(0)
        if self._path is not None:
            self._loading = asyncio.get_running_loop().run_in_executor(None, self._load)
        else:
            self._load()

    def _load(self) -> None:
        try:
            ctx = None  # a given model: its own max_context
            if self.model is None:
                assert self._path is not None
                self.model, ctx = load_model(self._path, self.config)
            m = self.model
            if self._template_path is not None:  # the file's special tokens
                self.template = ChatTemplate.from_path(self._template_path, m.file.metadata)
            else:
                self.template = self._template or (
                    ChatTemplate.from_tokenizer_config(m.path)
                    if Path(m.path).is_dir()  # a Hugging Face directory
                    else ChatTemplate.from_gguf(m.file.metadata)
                )
            decoder = m.batched(self.config.parallel, ctx)
            self.scheduler = Scheduler(
                decoder, m.tokenizer, self.config.max_queue, self._metrics, self.id
            )
        except Exception as e:  # reported by every request
            log.exception("model %s failed to load", self.id)
            self.load_error = e

    async def handle(self, endpoint: Endpoint, body: dict[str, Any], request: Request) -> Response:
        if self.load_error is not None:
            raise ApiError.unavailable(
                f"model {self.id!r} failed to load: {self.load_error}", code="load_failed"
            )
        model, sched = self.model, self.scheduler
        assert model is not None and sched is not None
        chat = endpoint is Endpoint.CHAT
        p = params(body, chat, self.config.max_tokens_limit)
        ids = await self._prompt_ids(body, chat)
        req = self._request(ids, p, chat)
        try:
            ticket = sched.submit(req)
        except QueueFull as e:
            raise ApiError.too_many(
                f"model {self.id!r}: {e}; retry after {self.config.retry_after_s} s",
                self.config.retry_after_s,
            ) from None
        except ServeError as e:
            raise ApiError.unavailable(f"model {self.id!r}: {e}", code="draining") from None
        reply = _Reply(self, chat, p, len(ids))
        if p.stream:
            return StreamingResponse(
                reply.stream(ticket, request),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        watch = _watch(request, ticket)
        try:
            events = [ev async for ev in ticket.events()]
        finally:
            watch.cancel()
            ticket.cancel()
        return JSONResponse(reply.whole(events))

    async def drain(self) -> None:
        while self.scheduler is not None and not self.scheduler.idle():
            await asyncio.sleep(0.01)

    def close(self) -> None:
        if self.scheduler is not None:
            self.scheduler.close()

    # ---- requests --------------------------------------------------------------------

    async def _prompt_ids(self, body: dict[str, Any], chat: bool) -> list[int]:
        model = self.model
        assert model is not None
        if chat:
            messages = chat_messages(body)
            if self.template is None:
                raise ApiError.bad_request(
                    f"model {self.id!r} has no chat template (its GGUF file has no "
                    f"tokenizer.chat_template): start the server with --chat-template FILE, "
                    f"or use /v1/completions with a prompt you format",
                    param="messages",
                    code="no_chat_template",
                )
            try:
                text = self.template.render(messages, add_generation_prompt=True)
            except TemplateError as e:
                raise ApiError.bad_request(
                    f"the chat template of model {self.id!r} cannot render these messages: {e}",
                    param="messages",
                    code="template_error",
                ) from None
            prompt: str | list[int] = text
        else:
            prompt = completion_prompt(body, model.config.vocab)
        if isinstance(prompt, list):
            return prompt
        if model.tokenizer is None:
            raise ApiError.bad_request(
                f"model {self.id!r} has no tokenizer: give the prompt as token ids",
                param="prompt" if not chat else "messages",
            )
        ids = await asyncio.to_thread(model.encode, prompt)
        if not ids:
            raise ApiError.bad_request(
                "the prompt has no tokens (an empty text and no BOS)", param="prompt"
            )
        return ids

    def _request(self, ids: list[int], p: GenParams, chat: bool) -> GenRequest:
        sched, cfg = self.scheduler, self.config
        assert sched is not None and self.model is not None
        field = "messages" if chat else "prompt"
        if len(ids) > cfg.prompt_limit:
            raise ApiError.bad_request(
                f"the prompt holds {len(ids)} tokens, more than the server's limit of "
                f"{cfg.prompt_limit} (max_prompt_tokens / ctx)",
                param=field,
                code="prompt_too_long",
            )
        room = sched.decoder.max_context - len(ids) + 1  # the last token is never run
        if room < 1:
            raise ApiError.bad_request(
                f"the prompt holds {len(ids)} tokens: no room is left for a new token in "
                f"the context of {sched.decoder.max_context} (ctx)",
                param=field,
                code="context_length_exceeded",
            )
        max_tokens = p.max_tokens if p.max_tokens is not None else min(room, cfg.max_tokens_limit)
        if max_tokens > room:
            raise ApiError.bad_request(
                f"the prompt of {len(ids)} tokens + max_tokens={max_tokens} needs "
                f"{len(ids) + max_tokens - 1} positions, more than the context of "
                f"{sched.decoder.max_context} (ctx): max_tokens may be at most {room}",
                param="max_tokens",
                code="context_length_exceeded",
            )
        try:
            sp = SamplingParams(p.temperature, 0, p.top_p, p.seed)
        except InputError as e:
            raise ApiError.bad_request(str(e)) from None
        tok = self.model.tokenizer
        stop_ids = frozenset(tok.stop_ids) if tok is not None else frozenset()
        return GenRequest(tuple(ids), max_tokens, sp, p.stop, stop_ids, p.logprobs)


def _watch(request: Request, ticket: Ticket) -> asyncio.Future[None]:
    """A task that cancels ``ticket`` when the client goes away. A stream needs it too:
    under ASGI 2.4 Starlette notices a gone client only when it next sends, and a
    request that waits for a slot or a long prefill sends nothing."""

    def gone(f: asyncio.Future[None]) -> None:
        if not f.cancelled():
            ticket.cancel()

    watch = asyncio.ensure_future(disconnected(request))
    watch.add_done_callback(gone)
    return watch


class _Reply:
    """One request's answer in OpenAI's schema: a whole JSON body or SSE chunks."""

    def __init__(self, svc: GenerationService, chat: bool, p: GenParams, prompt_tokens: int):
        self.svc = svc
        self.chat = chat
        self.p = p
        self.prompt_tokens = prompt_tokens
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self.offset = 0  # text offset of the next token (completions logprobs)

    def _usage(self, completion: int) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }

    def _token_text(self, token_id: int) -> tuple[str, list[int]]:
        tok = self.svc.model.tokenizer if self.svc.model is not None else None
        raw = tok.token_bytes(token_id) if tok is not None else b""
        return raw.decode("utf-8", errors="replace"), list(raw)

    def _chat_lp(self, lp: TokenLogprob) -> dict[str, Any]:
        text, raw = self._token_text(lp.token_id)
        top = []
        for t, v in lp.top:
            tt, tb = self._token_text(t)
            top.append({"token": tt, "logprob": v, "bytes": tb})
        return {"token": text, "logprob": lp.logprob, "bytes": raw, "top_logprobs": top}

    def _logprobs(self, lps: list[TokenLogprob]) -> dict[str, Any] | None:
        """The ``logprobs`` object of a choice holding the tokens ``lps``."""
        if self.p.logprobs is None:
            return None
        if self.chat:
            return {"content": [self._chat_lp(lp) for lp in lps]}
        tokens, offsets = [], []
        for lp in lps:
            text, _ = self._token_text(lp.token_id)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [{self._token_text(t)[0]: v for t, v in lp.top} for lp in lps],
            "text_offset": offsets,
        }

    @staticmethod
    def _check(last: Event) -> str:
        """The finish_reason of the last event (errors raised as ApiError)."""
        if last.finish is FinishReason.ERROR:
            raise ApiError.server_error(f"generation failed: {last.error}")
        if last.finish is FinishReason.CANCELLED and last.error is None:
            raise ApiError(499, "the client closed the connection", code="client_closed")
        if last.finish is FinishReason.CANCELLED:
            raise ApiError.unavailable(f"the request was cancelled: {last.error}", code="draining")
        assert last.finish is not None
        return last.finish.value

    def whole(self, events: list[Event]) -> dict[str, Any]:
        """The non-streamed answer."""
        last = events[-1]
        finish = self._check(last)
        text = "".join(ev.text for ev in events)
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs([ev.logprob for ev in events if ev.logprob])
        choice["finish_reason"] = finish
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.svc.id,
            "choices": [choice],
            "usage": self._usage(last.completion_tokens),
        }

    def _chunk(self, text: str | None, lps: list[TokenLogprob], finish: str | None,
               role: bool = False) -> str:  # fmt: skip
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = self._logprobs(lps) if lps else None
        choice["finish_reason"] = finish
        body: dict[str, Any] = {
            "id": self.id,
            "object": self.object + (".chunk" if self.chat else ""),
            "created": self.created,
            "model": self.svc.id,
            "choices": [choice],
        }
        if self.p.include_usage:
            body["usage"] = None
        return _sse(body)

    async def stream(self, ticket: Ticket, request: Request) -> AsyncIterator[str]:
        """The SSE chunks of a streamed answer; cancels the request if the client goes."""
        watch = _watch(request, ticket)
        try:
            if self.chat:
                yield self._chunk("", [], None, role=True)
            async for ev in ticket.events():
                lps = [ev.logprob] if ev.logprob is not None else []
                if ev.finish in (FinishReason.ERROR, FinishReason.CANCELLED):
                    try:
                        self._check(ev)
                    except ApiError as e:
                        yield _sse(e.body())
                    break
                if ev.text or lps:
                    yield self._chunk(ev.text, lps, None)
                if ev.finish is not None:
                    yield self._chunk(None if self.chat else "", [], ev.finish.value)
                    if self.p.include_usage:
                        yield _sse(
                            {
                                "id": self.id,
                                "object": self.object + (".chunk" if self.chat else ""),
                                "created": self.created,
                                "model": self.svc.id,
                                "choices": [],
                                "usage": self._usage(ev.completion_tokens),
                            }
                        )
            yield "data: [DONE]\n\n"
        finally:
            watch.cancel()
            ticket.cancel()


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
