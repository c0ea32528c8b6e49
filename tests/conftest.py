import os

import pytest
from hypothesis import HealthCheck, settings

from rlx.backends.cpu import native
from rlx.ops.base import registry_scope

# rlx's OpenMP wait policy is fixed before the first test module imports torch (whose
# libgomp would otherwise be loaded first, and then BLAS keeps one thread beside it: the
# documented rule, tested with explicit records in tests/cpu/test_threads_pool.py), so
# thread-count tests do not depend on which test files were collected
native.set_wait_policy()

# CI runs keep no example database and are derandomized: a submission lands or not on
# its own code, never on the draw. Local runs (the "dev" profile) draw new examples each
# time and so keep exploring; a failure they find becomes a fixed regression case.
settings.register_profile(
    "ci",
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=25, deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


@pytest.fixture(autouse=True)
def _isolated_registries():
    """Ops, Graph builder methods and custom ops registered by a test vanish after it."""
    with registry_scope():
        yield
