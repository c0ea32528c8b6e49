import os

import pytest
from hypothesis import HealthCheck, settings

from rlx.ops.base import registry_scope

# CI runs keep no example database: a run never replays what an earlier run found
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _isolated_registries():
    """Ops, Graph builder methods and custom ops registered by a test vanish after it."""
    with registry_scope():
        yield
