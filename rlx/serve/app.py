"""The Starlette app: routes, the API-key check, the body limit, JSON parsing, model
lookup, ``/health``, ``/metrics``, ``/v1/models`` and the lifespan (start every service;
on shutdown drain and close them).

A request to a model endpoint goes: drain gate (503 while draining) -> API key (401) ->
body of at most ``max_body_bytes`` (413) -> JSON object (400) -> ``model`` (400 when
missing, 404 when unknown) -> the endpoint among the service's (400) -> loaded (503) ->
``service.handle``. Every error is an OpenAI error object (:mod:`rlx.serve.errors`).
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from rlx.errors import ServeError
from rlx.serve.config import ServeConfig
from rlx.serve.errors import ApiError
from rlx.serve.metrics import CONTENT_TYPE, Metrics
from rlx.serve.schema import parse_body, string
from rlx.serve.service import Endpoint, Service

__all__ = ["create_app", "Gate", "error_response"]

log = logging.getLogger("rlx.serve")


class Gate:
    """The drain gate: counts requests in flight (until their last byte is sent) and,
    once :meth:`close` is called (SIGTERM), refuses new ones with 503."""

    def __init__(self) -> None:
        self.draining = False
        self.inflight = 0

    def close(self) -> None:
        """Refuse new requests from now on."""
        self.draining = True

    def idle(self) -> bool:
        """Whether no request is in flight."""
        return self.inflight == 0


def error_response(err: ApiError) -> JSONResponse:
    """The JSON response of ``err`` (its status, error object and headers)."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def _label(path: str) -> str:
    """The ``endpoint`` metric label of a request path."""
    for e in Endpoint:
        if path == e.path:
            return e.label
    return "models" if path.startswith("/v1/models") else "other"


class _Guard:
    """ASGI middleware: the drain gate, in-flight counting and the API key on ``/v1/``."""

    def __init__(self, app: ASGIApp, gate: Gate, metrics: Metrics, api_key: str | None):
        self.app, self.gate, self.metrics, self.api_key = app, gate, metrics, api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        err: ApiError | None = None
        if self.gate.draining and path != "/health":
            err = ApiError.unavailable("the server is shutting down", code="draining")
        elif self.api_key is not None and path.startswith("/v1/"):
            err = self._check_key(scope)
        if err is not None:
            self.metrics.requests.labels("", _label(path), str(err.status)).inc()
            await error_response(err)(scope, receive, send)
            return
        self.gate.inflight += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.gate.inflight -= 1

    def _check_key(self, scope: Scope) -> ApiError | None:
        assert self.api_key is not None
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        if not auth:
            return ApiError.unauthorized(
                "no API key given: send the header 'Authorization: Bearer <key>'"
            )
        scheme, _, key = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            key.strip().encode(), self.api_key.encode()
        ):
            return ApiError.unauthorized("the API key is wrong")
        return None


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing (413) one longer than ``limit`` bytes before reading it all."""
    too_large = ApiError.too_large(
        f"the request body is larger than the server's limit of {limit} bytes (max_body_bytes)"
    )
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(services: Sequence[Service], config: ServeConfig) -> Starlette:
    """The app serving ``services`` (each by its ``id``) with ``config``'s limits and key.

    ``app.state`` holds ``services`` (id -> service), ``config``, ``metrics`` and
    ``gate`` (the drain gate ``rlx serve`` closes on SIGTERM)."""
    by_id: dict[str, Service] = {}
    for s in services:
        if s.id in by_id:
            raise ServeError(f"two models have the id {s.id!r}; give one another id (ID=MODEL)")
        by_id[s.id] = s
    metrics = Metrics()
    gate = Gate()

    def lookup(model: str) -> Service:
        service = by_id.get(model)
        if service is None:
            raise ApiError.not_found(
                f"model {model!r} does not exist; this server serves: {', '.join(by_id) or 'none'}",
                param="model",
                code="model_not_found",
            )
        return service

    def endpoint_route(endpoint: Endpoint) -> Any:
        async def handler(request: Request) -> Response:
            t0 = time.perf_counter()
            model = ""
            try:
                body = parse_body(await _read_body(request, config.max_body_bytes))
                model = string(body, "model", required=True)
                service = lookup(model)
                if endpoint not in service.endpoints:
                    serves = ", ".join(sorted(e.path for e in service.endpoints))
                    raise ApiError.bad_request(
                        f"model {model!r} does not serve {endpoint.path}; it serves {serves}",
                        param="model",
                        code="unsupported_endpoint",
                    )
                if not service.ready():
                    failed = getattr(service, "load_error", None)
                    if failed is not None:
                        raise ApiError.unavailable(
                            f"model {model!r} failed to load: {failed}", code="load_failed"
                        )
                    raise ApiError.unavailable(f"model {model!r} is loading", code="loading")
                response = await service.handle(endpoint, body, request)
            except ApiError as e:
                response = error_response(e)
            except Exception as e:  # a bug: answer 500 and log it, never drop the request
                log.exception("%s on %s failed", endpoint.path, model or "?")
                response = error_response(ApiError.server_error(f"{type(e).__name__}: {e}"))
            label = model if model in by_id else ""
            metrics.requests.labels(label, endpoint.label, str(response.status_code)).inc()
            metrics.request_seconds.labels(label, endpoint.label).observe(time.perf_counter() - t0)
            return response

        return handler

    def model_card(s: Service) -> dict[str, Any]:
        return {"id": s.id, "object": "model", "created": s.created, "owned_by": "rlx"}

    async def list_models(request: Request) -> Response:
        metrics.requests.labels("", "models", "200").inc()
        return JSONResponse({"object": "list", "data": [model_card(s) for s in by_id.values()]})

    async def get_model(request: Request) -> Response:
        name = request.path_params["model"]
        try:
            card = model_card(lookup(name))
        except ApiError as e:
            metrics.requests.labels("", "models", str(e.status)).inc()
            return error_response(e)
        metrics.requests.labels(name, "models", "200").inc()
        return JSONResponse(card)

    async def health(request: Request) -> Response:
        if gate.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        failed = [s.id for s in by_id.values() if getattr(s, "load_error", None) is not None]
        if failed:
            return JSONResponse({"status": "error", "failed": failed}, status_code=503)
        loading = [s.id for s in by_id.values() if not s.ready()]
        if loading:
            return JSONResponse({"status": "loading", "loading": loading}, status_code=503)
        return JSONResponse({"status": "ok", "models": list(by_id)})

    async def prometheus(request: Request) -> Response:
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        if exc.status_code == 404:
            err = ApiError.not_found(f"no route {request.url.path}", code="unknown_url")
        else:
            err = ApiError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}")
        return JSONResponse(err.body(), status_code=exc.status_code, headers=exc.headers)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        for s in by_id.values():
            await s.start(metrics)
        try:
            yield
        finally:
            gate.close()
            for s in by_id.values():
                await s.drain()
            for s in by_id.values():
                s.close()

    routes = [Route(e.path, endpoint_route(e), methods=["POST"]) for e in Endpoint]
    routes += [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", get_model, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", prometheus, methods=["GET"]),
    ]
    app = Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
    app.state.services = by_id
    app.state.config = config
    app.state.metrics = metrics
    app.state.gate = gate
    app.add_middleware(_Guard, gate=gate, metrics=metrics, api_key=config.api_key)
    return app
