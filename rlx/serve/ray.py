"""``rlx serve`` past one machine: the app of :func:`rlx.serve.create_app`, one copy per Ray
Serve replica, behind Ray Serve's HTTP proxy. Needs the ``distributed`` extra (``pip install
'rlx[distributed]'``: ray[serve]) besides ``serve``; without it a DistributedError names it.

In: the same model arguments and :class:`rlx.serve.ServeConfig` as ``rlx serve``, a replica
count and the CPUs of each replica. Out: :func:`deployment` returns the bound Ray Serve
application (``ray.serve.run(app, route_prefix="/")`` serves it); :func:`run` does that on a
Ray cluster (``address``: None starts a local one) and blocks until SIGINT / SIGTERM.

Each replica is a Ray actor that loads the models itself (``load_services`` in its
constructor: Ray sends it the model arguments, not the weights, so each node reads its own
copy of the files) and answers through the same Starlette app as one ``rlx serve``
process; a replica gets traffic once its models are loaded. Every response carries the
header ``x-rlx-replica`` (the replica's Ray Serve id). Each replica keeps its own batcher,
KV slots and ``/metrics`` (a scrape through the proxy reaches one replica). A replica that
dies is restarted by Ray Serve; a request it was answering fails with a 5xx or a dropped
connection, which clients retry (the OpenAI clients do by default).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import os
import signal
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlx.errors import ServeError

if TYPE_CHECKING:
    from rlx.serve.config import ServeConfig
    from rlx.serve.service import Service

__all__ = ["REPLICA_HEADER", "RlxReplica", "deployment", "run"]

#: The response header naming the replica that answered.
REPLICA_HEADER = "x-rlx-replica"


class ReplicaHeader:
    """ASGI middleware of a replica: add ``x-rlx-replica: <id>`` to every HTTP response, and
    hold the app's startup (the lifespan's ``startup.complete``) until every service has
    loaded its model or failed to, so Ray Serve routes no request to a loading replica."""

    def __init__(self, app: Any, replica: str, services: Sequence[Service] = ()) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.encode(), replica.encode())
        self.services = list(services)

    async def _loaded(self) -> None:
        while not all(s.ready() or _load_error(s) is not None for s in self.services):
            await asyncio.sleep(0.1)

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":

            async def after_loading(message: Any) -> None:
                if message["type"] == "lifespan.startup.complete":
                    await self._loaded()
                await send(message)

            await self.app(scope, receive, after_loading)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def tagged(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), self.header]
            await send(message)

        await self.app(scope, receive, tagged)


def _load_error(service: Service) -> BaseException | None:
    error: BaseException | None = getattr(service, "load_error", None)
    return error


class RlxReplica:
    """One replica: the models of ``models`` loaded with ``config`` and the app serving
    them (made a Ray Serve ingress by :func:`deployment`). Attribute names start with
    ``rlx_``: Ray Serve's ingress wrapper owns ``app``."""

    def __init__(self, models: Sequence[str], config: ServeConfig) -> None:
        from ray import serve

        from rlx.serve.app import create_app
        from rlx.serve.loading import load_services

        self.rlx_replica_id = str(serve.get_replica_context().replica_id.unique_id)
        self.rlx_services = load_services(list(models), config, background=False)
        self.rlx_app = create_app(self.rlx_services, config)
        self.rlx_app.add_middleware(
            ReplicaHeader, replica=self.rlx_replica_id, services=self.rlx_services
        )

    def __serve_build_asgi_app__(self) -> Any:
        return self.rlx_app

    def check_health(self) -> None:
        """Ray Serve's periodic health check: raise when a model failed to load (Ray Serve
        then replaces the replica)."""
        failed = [f"{s.id}: {e}" for s in self.rlx_services if (e := _load_error(s)) is not None]
        if failed:
            raise RuntimeError(f"models failed to load: {'; '.join(failed)}")


def _check(replicas: int, cpus_per_replica: float) -> None:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ServeError(f"replicas must be an int >= 1, got {replicas!r}")
    if (
        isinstance(cpus_per_replica, bool)
        or not isinstance(cpus_per_replica, int | float)
        or not cpus_per_replica > 0
    ):
        raise ServeError(f"cpus_per_replica must be a number > 0, got {cpus_per_replica!r}")


def deployment(
    models: Sequence[str],
    config: ServeConfig | None = None,
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    name: str = "rlx",
    max_ongoing_requests: int | None = None,
) -> Any:
    """The Ray Serve application serving ``models`` from ``replicas`` replicas.

    ``models`` are ``rlx serve``'s model arguments (a directory, a .gguf file, a known name,
    ``ID=MODEL``), resolved on each replica's node. ``config`` (default ``ServeConfig()``)
    applies to every replica; its ``num_threads`` defaults to ``cpus_per_replica`` (at
    least 1), the CPUs Ray reserves for each replica. ``max_ongoing_requests`` (default:
    ``config.max_queue``) is how many requests Ray Serve lets into one replica at once, so
    the replica's own batcher sees concurrent requests. Returns the bound application for
    ``ray.serve.run``; host and port are Ray Serve's (``serve.start(http_options=...)``)."""
    from rlx.distributed import require

    require("ray", "ray.serve", what="rlx.serve.deployment")
    from rlx.serve import require as require_serve

    require_serve(what="rlx.serve.deployment")
    from ray import serve

    from rlx.serve.config import ServeConfig

    config = ServeConfig() if config is None else config
    if not isinstance(config, ServeConfig):
        raise ServeError(f"config must be a ServeConfig, got {type(config).__name__}")
    _check(replicas, cpus_per_replica)
    models = [str(m) for m in ([models] if isinstance(models, str) else models)]
    if not models:
        raise ServeError("no model given: pass at least one MODEL (a directory, .gguf or name)")
    if config.num_threads is None:
        config = dataclasses.replace(config, num_threads=max(1, math.floor(cpus_per_replica)))
    ongoing = config.max_queue if max_ongoing_requests is None else max_ongoing_requests
    if isinstance(ongoing, bool) or not isinstance(ongoing, int) or ongoing < 1:
        raise ServeError(f"max_ongoing_requests must be an int >= 1, got {ongoing!r}")
    ingress = serve.ingress()(RlxReplica)
    dep: Any = serve.deployment(
        ingress,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=ongoing,
        ray_actor_options={"num_cpus": cpus_per_replica},
    )
    return dep.bind(models, config)


def run(
    models: Sequence[str],
    config: ServeConfig | None = None,
    *,
    replicas: int = 1,
    cpus_per_replica: float = 1.0,
    address: str | None = None,
    name: str = "rlx",
    stop: threading.Event | None = None,
) -> None:
    """Serve ``models`` on Ray Serve at ``config.host:config.port`` until SIGINT / SIGTERM
    (or ``stop`` is set), then shut Ray Serve down. ``address``: a Ray cluster to join
    ("auto", "host:6379", "ray://head:10001"); None starts a local Ray instance."""
    from rlx.serve.config import ServeConfig

    config = ServeConfig() if config is None else config
    app = deployment(
        models, config, replicas=replicas, cpus_per_replica=cpus_per_replica, name=name
    )
    import ray
    from ray import serve

    started = not ray.is_initialized()
    if started:
        if address is None:  # a local instance: give a busy machine time to start the proxy
            for var in (
                "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S",
                "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S",
            ):
                os.environ.setdefault(var, "60")
        ray.init(address=address)
    stop = stop or threading.Event()
    previous = {
        s: signal.signal(s, lambda *_: stop.set())
        for s in (signal.SIGINT, signal.SIGTERM)
        if threading.current_thread() is threading.main_thread()
    }
    try:
        serve.start(http_options={"host": config.host, "port": config.port})
        serve.run(app, name=name, route_prefix="/", blocking=False)
        while not stop.wait(0.5):
            pass
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        serve.shutdown()
        if started:
            ray.shutdown()
