"""``rlx serve --ray --replicas N MODEL ...``: the server of ``rlx serve`` on Ray Serve
replicas (:func:`rlx.serve.ray.run`). In: the models and ServeConfig of ``rlx serve``, the
replica count, the CPUs per replica and a Ray address. Out: Ray Serve's proxy listening on
``--host:--port`` until SIGINT / SIGTERM. Without the ``distributed`` extra: a one-line
error naming ``pip install 'rlx[distributed]'``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from rlx.cli.common import status

__all__ = ["options", "run"]


def options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--ray``, ``--replicas``, ``--cpus-per-replica`` and ``--ray-address``."""
    fn = click.option(
        "--ray-address", default=None,
        help="With --ray: a Ray cluster to join (auto, host:6379, ray://head:10001); "
        "default: start a local one.",
    )(fn)  # fmt: skip
    fn = click.option(
        "--cpus-per-replica", type=click.FloatRange(min=0, min_open=True), default=1.0,
        show_default=True, help="With --ray: CPUs Ray reserves per replica (= its threads).",
    )(fn)  # fmt: skip
    fn = click.option(
        "--replicas", type=click.IntRange(min=1), default=1, show_default=True,
        help="With --ray: replicas, each loading every MODEL.",
    )(fn)  # fmt: skip
    return click.option(
        "--ray", "use_ray", is_flag=True,
        help="Serve on Ray Serve replicas (needs pip install 'rlx[distributed]').",
    )(fn)  # fmt: skip


def run(models: list[str], config: Any, *, replicas: int, cpus: float, address: str | None) -> int:
    """Serve ``models`` on Ray Serve until SIGINT / SIGTERM; the exit status."""
    from rlx.distributed import require

    require("ray", "ray.serve", what="rlx serve --ray")
    from rlx.serve.ray import run as ray_run

    where = address or "a local Ray instance"
    status(
        f"serving {', '.join(models)} from {replicas} Ray Serve replica(s) on {where}, "
        f"http://{config.host}:{config.port}"
    )
    ray_run(models, config, replicas=replicas, cpus_per_replica=cpus, address=address)
    return 0
