"""The native schedule (rlx/backends/cpu/native/schedule.py): consecutive native kernels
run by one C loop over descriptors give exactly what the Python closure schedule (the
oracle) gives; the calling-convention trick passes mixed integer / float arguments where
each C prototype expects them; a checked kernel that fails raises its own error; what
cannot be described stays a Python call."""

from __future__ import annotations

import ctypes
import functools

import numpy as np
import pytest

import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native.schedule import MAX_INT_ARGS, Segment, native_call, segments
from rlx.models import encoder, random_params
from rlx.options import CompileOptions
from rlx.runtime.session import Session

pytestmark = pytest.mark.skipif(not native.available(), reason="needs gcc")

OPTS = CompileOptions(use_cache=False, verbose=False, num_threads=1)

PROBE = r"""
#include <stdint.h>
void probe_mixed(double *out, long a, float f, void *p, double d, int b, float g,
                 long c, long d2, long e, long h, long i) {
  out[0] = (double)a; out[1] = f; out[2] = (double)(intptr_t)p; out[3] = d; out[4] = b;
  out[5] = g; out[6] = (double)(c + 10 * d2 + 100 * e + 1000 * h + 10000 * i);
}
int probe_status(long *count, long status) { *count += 1; return (int)status; }
"""


@functools.cache
def probe_lib() -> ctypes.CDLL:
    lib = native.load(native.build(PROBE, native.Isa.PLAIN, "schedule_probe"))
    L, P, F, D = ctypes.c_long, ctypes.c_void_p, ctypes.c_float, ctypes.c_double
    lib.probe_mixed.argtypes = [P, L, F, P, D, ctypes.c_int, F, L, L, L, L, L]
    lib.probe_mixed.restype = None
    lib.probe_status.argtypes = [P, L]
    lib.probe_status.restype = ctypes.c_int
    return lib


def ln_chain(n: int) -> rlx.Graph:
    g = rlx.Graph("ln_chain_sched")
    x = g.input("x", (3, 40))
    gamma, beta = g.param("g", (40,)), g.param("b", (40,))
    y = x
    for i in range(n):
        y = g.layer_norm(g.add(y, x) if i % 2 else y, gamma, beta, 1e-5)
    g.set_outputs([y])
    return g


def _both(g: rlx.Graph, params: dict, feed: dict) -> tuple[list, list, object]:  # noqa: ANN401
    got = {}
    for on in (False, True):
        cg = Session("cpu").compile(g, OPTS.replace(native_schedule=on), params=params)
        got[on] = (cg.run(feed), cg._executor_any())
    return got[False][0], got[True][0], got[True][1]


def test_layer_norm_chain_runs_as_one_c_call_with_identical_results() -> None:
    g = ln_chain(12)
    rng = np.random.default_rng(0)
    ps = {"g": rng.random(40, np.float32), "b": rng.random(40, np.float32)}
    feed = {"x": rng.standard_normal((3, 40)).astype(np.float32)}
    py, nat, ex = _both(g, ps, feed)
    np.testing.assert_array_equal(py[0], nat[0])
    assert [type(f) for f in ex.fast] == [Segment] and len(ex.fast[0].kernels) == len(ex.schedule)
    np.testing.assert_allclose(nat[0], g.evaluate(feed, ps)[0], rtol=1e-4, atol=1e-5)


def test_encoder_native_schedule_matches_the_closure_schedule() -> None:
    g = encoder(
        layers=2,
        hidden=32,
        heads=4,
        ffn=64,
        seq=rlx.sym("seq"),
        batch=rlx.sym("batch"),
        fused_attention=True,
    )
    ps = random_params(g, 5)
    for b, s in [(1, 3), (2, 9)]:
        feed = {"x": np.random.default_rng(s).standard_normal((b, s, 32)).astype(np.float32)}
        py, nat, _ = _both(g, ps, feed)
        np.testing.assert_array_equal(py[0], nat[0])


def test_mixed_integer_and_float_arguments_reach_their_parameters() -> None:
    lib = probe_lib()
    out = np.zeros(7, np.float64)
    p = ctypes.c_void_p(out.ctypes.data)
    k = functools.partial(
        lib.probe_mixed, p, ctypes.c_long(-7), ctypes.c_float(1.5), ctypes.c_void_p(4096),
        ctypes.c_double(-2.25), ctypes.c_int(-3), ctypes.c_float(0.125), 1, 2, 3, 4, 5,
    )  # fmt: skip
    assert native_call(k) is not None
    count = np.zeros(1, np.int64)
    ok = functools.partial(lib.probe_status, ctypes.c_void_p(count.ctypes.data), 0)
    (seg,) = segments([k, ok])
    assert isinstance(seg, Segment)
    seg()
    np.testing.assert_array_equal(out, [-7, 1.5, 4096, -2.25, -3, 0.125, 54321])
    assert count[0] == 1


def test_a_failing_checked_kernel_raises_its_own_error() -> None:
    lib = probe_lib()
    count = np.zeros(1, np.int64)
    ran: list[str] = []

    class Checked:
        def __init__(self, status: int):
            self.native_call = (
                lib.probe_status,
                (ctypes.c_void_p(count.ctypes.data), status),
                True,
            )
            self.status = status

        def __call__(self) -> None:
            ran.append(f"py{self.status}")
            if lib.probe_status(ctypes.c_void_p(count.ctypes.data), self.status):
                raise RuntimeError(f"kernel failed with {self.status}")

    (seg,) = segments([Checked(0), Checked(0), Checked(3), Checked(0)])
    with pytest.raises(RuntimeError, match="failed with 3"):
        seg()
    # C ran kernels 0-2 (2 failed), then Python re-ran kernel 2, which raised
    assert count[0] == 4 and ran == ["py3"]


def test_what_cannot_be_described_stays_a_python_call() -> None:
    lib = probe_lib()
    count = np.zeros(1, np.int64)
    ok = functools.partial(lib.probe_status, ctypes.c_void_p(count.ctypes.data), 0)
    assert native_call(lambda: None) is None
    assert native_call(functools.partial(lib.probe_status, ctypes.c_void_p(0))) is None  # unbound
    assert native_call(functools.partial(lib.probe_status, b"x", 0)) is None  # bytes argument
    too_many = type(
        "K", (), {"native_call": (lib.probe_status, (0,) * (MAX_INT_ARGS + 1), False)}
    )()
    assert native_call(too_many) is None
    py = lambda: None  # noqa: E731
    assert segments([ok, py, ok]) == [ok, py, ok]  # no run of two: nothing to gain


def test_sgemm_and_attention_kernels_join_the_native_schedule(monkeypatch) -> None:  # noqa: ANN001
    """The weight products on rlx's sgemm and the native attention describe their C call
    (``native_call``), so a transformer layer runs as one segment."""
    monkeypatch.setenv("RLX_SGEMM", "native")
    g = encoder(layers=1, hidden=32, heads=4, ffn=64, seq=5, batch=2, fused_attention=True)
    cg = Session("cpu").compile(g, OPTS, params=random_params(g, 1))
    cg.run({"x": np.ones((2, 5, 32), np.float32)})
    ex = cg._executor_any()
    kinds = {}
    for e, k in zip(ex.kernel_entries, ex.schedule, strict=True):
        if e.kind.value == "native" and e.op in ("fused_matmul_bias_act", "attention"):
            kinds.setdefault(e.op, []).append(native_call(k) is not None)
    assert kinds.get("attention") == [True]
    assert kinds.get("fused_matmul_bias_act") and all(kinds["fused_matmul_bias_act"])
