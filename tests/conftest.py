import os

import pytest
from hypothesis import HealthCheck, settings

from rlx.backends.cpu import native
from rlx.ops.base import registry_scope

# The test suite verifies the graph after every compile pass, so a pass that breaks an
# invariant fails at that pass, named, instead of at the end or in a later pass. Users keep
# the fast default (RLX_VERIFY unset: verify once, after the last pass). An explicit
# RLX_VERIFY in the environment wins: `RLX_VERIFY=end pytest ...` runs the suite as users
# compile. rlx reads the variable each time a CompileOptions is built (never at import),
# and subprocesses started by tests inherit it. docs/testing.md.
_RUNNER_RLX_VERIFY = os.environ.get("RLX_VERIFY")
os.environ.setdefault("RLX_VERIFY", "each")

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


@pytest.fixture
def runner_rlx_verify() -> str | None:
    """RLX_VERIFY as this process was started with (None: unset, so the suite's "each";
    an xdist worker inherits the "each" its controller set)."""
    return _RUNNER_RLX_VERIFY
