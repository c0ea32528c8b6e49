"""Every bad input to a CompiledGraph is an InputError naming the tensor, expected vs
given, and the user line that built its node; unsupported ops fail at compile time."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.backends.cpu.kernels import KERNELS, load_kernels
from rlx.errors import InputError, UnsupportedOpError
from rlx.ops.custom import Custom, register_custom_op
from rlx.options import CompileOptions
from rlx.runtime.session import Session

HERE = "test_errors.py"


def graph() -> rlx.Graph:
    g = rlx.Graph("errs")
    b = g.sym("batch", min=1, max=4)
    x = g.input("x", (b, 3))
    y = g.input("y", (b, 3))
    n = g.input("n", (2,), "i32")
    w = g.param("w", (3, 2))
    g.set_outputs([g.matmul(g.add(x, y), w), g.mul(n, n)])
    return g


def compiled(**opts: object) -> rlx.runtime.compiled.CompiledGraph:
    return Session("cpu").compile(
        graph(), CompileOptions(use_cache=False, **opts), params={"w": np.ones((3, 2), np.float32)}
    )


def good() -> dict[str, object]:
    return {
        "x": np.zeros((2, 3), np.float32),
        "y": np.zeros((2, 3), np.float32),
        "n": np.array([1, 2], np.int32),
    }


def run_with(cg: object, **changes: object) -> None:
    feed = good()
    for k, v in changes.items():
        if v is None:
            del feed[k]
        else:
            feed[k] = v
    cg.run(feed)  # type: ignore[attr-defined]


def test_unknown_input_lists_available() -> None:
    with pytest.raises(InputError, match=r"unknown input\(s\) \['z'\].*\['x', 'y', 'n'\]"):
        run_with(compiled(), z=np.zeros(3))


def test_missing_input_lists_available() -> None:
    with pytest.raises(InputError, match=r"missing input\(s\) \['y'\].*\['x', 'y', 'n'\]"):
        run_with(compiled(), y=None)


def test_not_a_mapping() -> None:
    with pytest.raises(InputError, match="dict of input name"):
        compiled().run([np.zeros((2, 3))])  # type: ignore[arg-type]


def test_wrong_rank_and_dim_name_expected_given_and_line() -> None:
    with pytest.raises(
        InputError, match=r"input 'x': expected rank 2 f32\[batch,3\], given shape \(6,\)"
    ) as ei:
        run_with(compiled(), x=np.zeros(6, np.float32))
    assert HERE in str(ei.value) and ei.value.loc is not None
    with pytest.raises(
        InputError,
        match=r"input 'y': expected f32\[batch,3\], given shape \(2, 4\) \(dim 1 is 4, expected 3\)",
    ):
        run_with(compiled(), y=np.zeros((2, 4), np.float32))


def test_symbolic_conflict_and_bounds() -> None:
    with pytest.raises(InputError, match=r"'batch' is 3 here .* but 2 in input 'x'"):
        run_with(compiled(), y=np.zeros((3, 3), np.float32))
    with pytest.raises(InputError, match=r"'batch' = 5 is outside its declared bounds \[1, 4\]"):
        run_with(compiled(), x=np.zeros((5, 3), np.float32), y=np.zeros((5, 3), np.float32))


def test_lossy_dtypes_rejected() -> None:
    with pytest.raises(InputError, match=r"input 'x': expected dtype f32 .* given float64"):
        run_with(compiled(), x=np.zeros((2, 3)))
    with pytest.raises(InputError, match=r"input 'n': expected dtype i32 .* given int64"):
        run_with(compiled(), n=np.array([1, 2]))
    with pytest.raises(InputError, match=r"input 'n': expected dtype i32, given Python f-kind"):
        run_with(compiled(), n=[1.5, 2.0])
    with pytest.raises(
        InputError, match=r"input 'n': values in \[1, 4294967296\] do not fit dtype i32"
    ):
        run_with(compiled(), n=[1, 2**32])
    with pytest.raises(InputError, match="cannot make an array"):
        run_with(compiled(), n=[[1, 2], [3]])


def test_params_unknown_unset_wrong_shape_dtype() -> None:
    cg = Session("cpu").compile(graph(), CompileOptions(use_cache=False))
    with pytest.raises(InputError, match=r"param\(s\) \['w'\] never set") as ei:
        cg.run(good())
    assert HERE in str(ei.value)
    with pytest.raises(InputError, match=r"unknown param 'v'; params of graph 'errs': \['w'\]"):
        cg.set_param("v", np.zeros(2))
    with pytest.raises(InputError, match=r"unknown params \['v'\]"):
        cg.set_params({"w": np.zeros((3, 2), np.float32), "v": 1})
    with pytest.raises(InputError, match=r"param 'w': expected f32\[3,2\], given shape \(2, 3\)"):
        cg.set_param("w", np.zeros((2, 3), np.float32))
    with pytest.raises(InputError, match=r"param 'w': expected dtype f32"):
        cg.set_param("w", np.zeros((3, 2), np.complex64))
    cg.set_param("w", np.ones((3, 2), np.float32))
    assert cg.run(good())[0].shape == (2, 2)


def test_check_finite() -> None:
    x = np.zeros((2, 3), np.float32)
    x[1, 2] = np.nan
    run_with(compiled(), x=x)  # off by default
    with pytest.raises(
        InputError, match=r"input 'x': 1 non-finite value\(s\) .* index \(1, 2\)"
    ) as ei:
        run_with(compiled(check_finite=True), x=x)
    assert HERE in str(ei.value)
    with pytest.raises(InputError, match="param 'w'.*non-finite"):
        compiled(check_finite=True).set_param("w", np.full((3, 2), np.inf, np.float32))


def test_unsupported_ops_fail_at_compile_time_listing_all(monkeypatch: pytest.MonkeyPatch) -> None:
    register_custom_op(
        "no_cpu_a", lambda ins, attrs: ins[0], lambda xs, attrs, ctx: xs[0], arity=1, replace=True
    )

    def refuse(node, ins, out, ctx):  # noqa: ANN001, ANN202
        raise UnsupportedOpError(f"custom op {node.op.name!r} has no CPU kernel")

    load_kernels()  # register every kernel first: the patch must not be overwritten
    monkeypatch.setitem(KERNELS, Custom, refuse)
    g = rlx.Graph("unsup")
    x = g.input("x", (3,))
    a = g.custom("no_cpu_a", [x])
    b = g.custom("no_cpu_a", [g.exp(a)])
    g.set_outputs([b])
    with pytest.raises(UnsupportedOpError, match=r"does not support 2 node\(s\)") as ei:
        Session("cpu").compile(g, CompileOptions(use_cache=False, optimize=False))
    text = str(ei.value)
    assert text.count("no CPU kernel") == 2 and HERE in text


def test_error_inside_a_kernel_names_the_node() -> None:
    g = rlx.Graph("kerr")
    x = g.input("x", (4,))
    idx = g.input("idx", (1,), "i32")
    g.set_outputs([g.gather(x, idx)])
    cg = Session("cpu").compile(g)
    for profile in (False, True):
        with pytest.raises(InputError, match=r"%\d+ gather.*out of range") as ei:
            cg.run({"x": np.zeros(4, np.float32), "idx": [9]}, profile=profile)
        assert ei.value.node is not None and HERE in str(ei.value)


def test_low_precision_inputs_policy_and_finiteness() -> None:
    import ml_dtypes

    g = rlx.Graph("bf")
    x = g.input("x", (3,), "bf16")
    g.set_outputs([g.mul(x, 2.0)])
    cg = Session("cpu").compile(g, CompileOptions(use_cache=False, check_finite=True))
    want = np.array([2, -4, 1], ml_dtypes.bfloat16)
    for ok in (
        np.array([1, -2, 0.5], ml_dtypes.bfloat16),
        np.array([1, -2, 0], np.int8) + 0,
        [1.0, -2.0, 0.5],
    ):
        got = cg.run({"x": ok})[0]
        assert got.dtype == want.dtype
    with pytest.raises(InputError, match=r"input 'x': expected dtype bf16 .* given float32"):
        cg.run({"x": np.ones(3, np.float32)})
    with pytest.raises(InputError, match=r"non-finite.*index \(1,\)"):
        cg.run({"x": np.array([1, np.inf, 0], ml_dtypes.bfloat16)})
