"""Graph.fingerprint, the compile-cache key: graphs that differ anywhere in an attribute
(a constant's 9th element, a sub-graph nested in a custom op's tuple attribute, the sign of
a zero, a NaN payload, a field a dataclass leaves out of its repr) get different keys, and
a Session compiles each one to its own program; equal graphs built apart get equal keys."""

import dataclasses
import math
import struct

import numpy as np
import pytest

import rlx
from rlx.ops.core import ConstValue
from rlx.ops.custom import register_custom_op, unregister_custom_op


def _nan(payload: int) -> float:
    """A quiet NaN with mantissa payload ``payload``."""
    return struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000000 | payload))[0]


def _apply_attrs(xs, attrs, ctx):
    """x + k + f + the sub-graph's result on x + the dataclass's hidden offset: every
    attribute changes the output, so a wrong cache hit shows in the numbers."""
    out = xs[0].astype(np.float64)
    if "k" in attrs:
        out = out + attrs["k"].array()
    if "f" in attrs:
        out = out + attrs["f"]
    if "nested" in attrs:
        (_, sub), *_ = attrs["nested"]
        out = out + sub.evaluate({"x": xs[0]})[0]
    if "cfg" in attrs:
        out = out + attrs["cfg"].hidden
    return out.astype(xs[0].dtype)


@pytest.fixture
def apply_attrs():
    register_custom_op("t_fp_apply", lambda ins, a: ins[0], _apply_attrs, arity=1)
    yield "t_fp_apply"
    unregister_custom_op("t_fp_apply")


@dataclasses.dataclass(frozen=True)
class Cfg:
    label: str
    hidden: float = dataclasses.field(default=0.0, repr=False)


def _sub(c: float) -> rlx.Graph:
    s = rlx.Graph("sub")
    x = s.input("x", (9,))
    s.set_outputs(s.add(x, s.constant(np.full(9, c, np.float32))))
    return s


def _graph(op: str, **attrs) -> rlx.Graph:
    g = rlx.Graph("g")
    x = g.input("x", (9,))
    g.set_outputs(g.custom(op, [x], **attrs))
    return g


def _k(ninth: float) -> ConstValue:
    a = np.arange(9, dtype=np.float32)
    a[8] = ninth
    return ConstValue.of(a)


def _pairs(op: str) -> dict[str, tuple[rlx.Graph, rlx.Graph]]:
    """Graph pairs that differ in exactly one place that repr() hid."""
    return {
        "9th element of a constant": (_graph(op, k=_k(8.0)), _graph(op, k=_k(100.0))),
        "sub-graph nested in a tuple": (
            _graph(op, nested=(("body", _sub(1.0)),)),
            _graph(op, nested=(("body", _sub(2.0)),)),
        ),
        "NaN payload": (_graph(op, f=_nan(1)), _graph(op, f=_nan(2))),
        "dataclass field left out of repr": (
            _graph(op, cfg=Cfg("a", 1.0)),
            _graph(op, cfg=Cfg("a", 2.0)),
        ),
    }


def test_graphs_differing_only_in_a_hidden_attribute_get_different_keys(apply_attrs):
    for what, (a, b) in _pairs(apply_attrs).items():
        assert a != b, what
        assert a.fingerprint() != b.fingerprint(), what


def test_signed_zero_and_top_level_constants_are_told_apart():
    def scaled(c: float) -> rlx.Graph:
        g = rlx.Graph("g")
        g.set_outputs(g.mul(g.input("x", (2,)), c))
        return g

    def plus(ninth: float) -> rlx.Graph:
        g = rlx.Graph("g")
        g.set_outputs(g.add(g.input("x", (9,)), g.constant(_k(ninth).array())))
        return g

    assert scaled(0.0).fingerprint() != scaled(-0.0).fingerprint()
    assert plus(8.0).fingerprint() != plus(100.0).fingerprint()
    assert plus(0.0).fingerprint() != plus(-0.0).fingerprint()


def test_a_session_runs_each_graph_its_own_program(apply_attrs):
    """Compiled back to back through the in-process compile cache, each graph returns the
    result NumPy computes for it (not the program cached for the other one)."""
    x = np.linspace(-1, 1, 9, dtype=np.float32)
    want = {
        "9th element of a constant": (x + _k(8.0).array(), x + _k(100.0).array()),
        "sub-graph nested in a tuple": (x + (x + 1.0), x + (x + 2.0)),
        "dataclass field left out of repr": (x + 1.0, x + 2.0),
    }
    pairs = _pairs(apply_attrs)
    for what, expected in want.items():
        for g, exp in zip(pairs[what], expected):
            (got,) = rlx.Session("cpu").compile(g).run({"x": x})
            np.testing.assert_allclose(got, exp, rtol=1e-6, err_msg=what)


def test_equal_graphs_built_apart_have_equal_keys(apply_attrs):
    for what, (a, _) in _pairs(apply_attrs).items():
        again = _pairs(apply_attrs)[what][0]
        again.name = "renamed"  # the graph's name is not part of the key
        assert again.fingerprint() == a.fingerprint(), what
    assert (
        _graph(apply_attrs, f=math.nan).fingerprint()
        == _graph(apply_attrs, f=math.nan).fingerprint()
    )


def test_attribute_types_are_part_of_the_key(apply_attrs):
    """1, 1.0, True and "1", a tuple and the tuple holding it, are different attributes."""
    values = [1, 1.0, True, "1", (1,), ((1,),), None, (), ("f", 1), frozenset({1}), 1 + 0j]
    keys = {_graph(apply_attrs, f=v).fingerprint() for v in values}
    assert len(keys) == len(values)
    # a set hashes by content, whatever its iteration order
    a = _graph(apply_attrs, f=frozenset({"x", "y", "zz"})).fingerprint()
    assert a == _graph(apply_attrs, f=frozenset({"zz", "y", "x"})).fingerprint()


def test_a_shared_sub_graph_is_hashed_once(apply_attrs, monkeypatch):
    from rlx.ir import mir

    sub = _sub(1.0)
    g = rlx.Graph("g")
    h = g.input("x", (9,))
    for _ in range(50):
        h = g.custom(apply_attrs, [h], nested=(("body", sub),))
    g.set_outputs(h)
    calls = []
    real = mir._graph_digest
    monkeypatch.setattr(mir, "_graph_digest", lambda gr, memo: calls.append(gr) or real(gr, memo))
    g.fingerprint()
    assert calls.count(sub) == 1 and len(calls) == 2
