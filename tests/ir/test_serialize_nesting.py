"""Deeply nested sub-graphs in graph files (issue 29): a graph of 150 nested ``If`` builds,
runs and verifies, so it must survive save / load (it failed at nesting 33, and the JSON
encoder and the decoder recursed); an absurdly deep file (10**5 levels) stays a
SerializationError, never a RecursionError or a crash. Version 2 keeps sub-graphs in a
flat table (see rlx/ir/serialize_codec.py); these tests also cover the table's checks and
that version 1 files (sub-graphs nested in place) still load."""

import hashlib
import json
import struct

import numpy as np
import pytest

import rlx
from rlx import DType, Shape
from rlx.errors import SerializationError
from rlx.ir.serialize import MAGIC, dumps, load, loads, save
from rlx.ir.serialize_codec import MAX_NESTING
from rlx.ops.control import build_subgraph

S = Shape((3,), DType.F32)
X = np.array([-1.5, 0.25, 2.0], np.float32)


def _nested_ifs(depth: int) -> rlx.Graph:
    """``depth`` If nested in each other's then-branches (built innermost first: the
    builder functions of g.cond would recurse). Each level flips the operand's sign (its
    else branch) or not, so the output depends on every level's predicate."""
    inner = build_subgraph("leaf", [S], lambda s, a: s.exp(a))
    for level in range(1, depth):

        def fn(s, a, inner=inner, level=level):
            p = s.constant(np.array(level % 3 != 0))
            return s.cond(p, inner, lambda s2, b: s2.mul(s2.neg(b), 0.5), [s.add(a, 0.125)])

        inner = build_subgraph(f"level{level}", [S], fn)
    g = rlx.Graph("deep")
    x = g.input("x", S)
    g.set_outputs(g.cond(g.constant(np.array(True)), inner, lambda s, a: s.neg(a), [x]))
    return g


def _frame(data: bytes) -> tuple[int, dict, bytes]:
    _, version, hl, bl = struct.unpack_from("<4sIQQ", data)
    return version, json.loads(data[24 : 24 + hl]), data[24 + hl : 24 + hl + bl]


def _reframe(header: dict | bytes, blobs: bytes = b"", version: int = 2) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    body = struct.pack("<4sIQQ", MAGIC, version, len(text), len(blobs)) + text + blobs
    return body + hashlib.sha256(body).digest()


# ---- round trips -------------------------------------------------------------------


def test_150_nested_ifs_round_trip_and_run_as_the_original(tmp_path):
    g = _nested_ifs(150)
    g.verify()
    (ref,) = g.evaluate({"x": X})
    path = tmp_path / "deep.rlx"
    save(g, path)
    g2, params = load(path)
    assert params == {}
    assert dumps(g2) == dumps(g)  # the same graph (Graph.__eq__ recurses too deep here)
    (out,) = g2.evaluate({"x": X})
    np.testing.assert_array_equal(out, ref)
    (compiled,) = rlx.Session("cpu").compile(g2).run({"x": X})
    np.testing.assert_allclose(compiled, ref, rtol=1e-6)


def test_nesting_as_deep_as_the_verifier_goes_round_trips():
    """600 levels: within what the verifier and the reference interpreter handle under
    Python's default recursion limit (about 980 outside pytest); the file has no limit of
    its own below MAX_NESTING."""
    g = _nested_ifs(600)
    (ref,) = g.evaluate({"x": X})
    data = dumps(g, locations=False)
    g2, _ = loads(data)
    assert dumps(g2, locations=False) == data
    (out,) = g2.evaluate({"x": X})
    np.testing.assert_array_equal(out, ref)


def test_every_sub_graph_holder_round_trips_nested():
    """If, While, Scan and fused regions inside each other, a sub-graph object used by two
    nodes (stored twice: a file never shares one), and params next to them."""
    g = rlx.Graph("mixed")
    x = g.input("x", S)
    w = g.param("w", (3,))
    region = g.elementwise_region([x, w], lambda s, a, b: s.tanh(s.add(a, b)))
    shared = build_subgraph("shared", [S], lambda s, a: s.relu(a))

    def body(s, c):
        inner = s.cond(s.constant(np.array(False)), shared, shared, [c])
        return [s.scan(lambda s2, d: [s2.add(d, 1.0)], [inner], length=2)]

    looped = g.scan(body, [region], length=3)
    g.set_outputs(
        g.while_loop(
            lambda s, c: s.lt(s.sum(c, axes=0), s.constant(np.float32(100))),
            lambda s, c: [s.mul(c, 2.0)],
            [looped],
            max_iterations=50,
        )
    )
    params = {"w": np.array([0.5, -0.5, 1.0], np.float32)}
    (ref,) = g.evaluate({"x": X}, params)
    g2, p2 = loads(dumps(g, params))
    assert g2 == g
    (out,) = g2.evaluate({"x": X}, p2)
    np.testing.assert_array_equal(out, ref)


def test_version_1_files_with_sub_graphs_in_place_still_load():
    g = _nested_ifs(20)
    _, header, blobs = _frame(dumps(g))
    table = header.pop("subgraphs")

    def inline(v):  # version 2 references -> the version 1 layout, sub-graphs in place
        if isinstance(v, dict):
            if set(v) == {"graph"} and type(v["graph"]) is int:
                return {"graph": inline(table[v["graph"]])}
            return {k: inline(x) for k, x in v.items()}
        return [inline(x) for x in v] if isinstance(v, list) else v

    header["graph"] = inline(header["graph"])
    g1, _ = loads(_reframe(header, blobs, version=1))
    assert dumps(g1) == dumps(g)
    np.testing.assert_array_equal(g1.evaluate({"x": X})[0], g.evaluate({"x": X})[0])


# ---- too deep: a SerializationError, never a RecursionError ------------------------


def test_saving_nesting_beyond_the_format_bound_is_a_serialization_error():
    g = _nested_ifs(MAX_NESTING + 10)
    with pytest.raises(SerializationError, match=f"nested more than {MAX_NESTING} deep"):
        dumps(g)


def test_saving_nesting_too_deep_to_verify_says_so():
    """Under the bound but beyond Python's recursion limit for the verifier."""
    g = _nested_ifs(3000)
    with pytest.raises(SerializationError, match="nest 3000 deep, too deep to verify"):
        dumps(g)


def _scan_chain(levels: int) -> bytes:
    """A crafted version 2 file: a Scan whose body is a Scan whose body ... ``levels``
    deep (the JSON is written directly: building such a graph would take minutes)."""
    scalar = '"shape":{"dims":[],"dtype":"f32"}'
    inp = '{"attrs":{"name":"%s","shape":{%s}},"inputs":[],"op":"input",%s}'
    scan = (
        '{"attrs":{"body":{"graph":%d},"length":1,"num_carry":1,"output_index":0,'
        '"reverse":false},"inputs":[0],"op":"scan",' + scalar + "}"
    )
    leaf = (
        '{"name":"leaf","nodes":[' + inp % ("in0", scalar, scalar) + ","
        '{"attrs":{"fn":{"enum":"UnaryKind","member":"EXP"}},"inputs":[0],"op":"unary",'
        + scalar
        + '}],"outputs":[1],"sym_bounds":[]}'
    )

    def link(name: str, k: int) -> str:
        nodes = inp % (name, scalar, scalar) + "," + scan % k
        return '{"name":"b","nodes":[' + nodes + '],"outputs":[1],"sym_bounds":[]}'

    subs = ",".join([leaf] + [link("in0", k - 1) for k in range(1, levels)])
    text = (
        '{"blobs":[],"params":[],"producer":"crafted","graph":'
        + link("x", levels - 1)
        + ',"subgraphs":['
        + subs
        + "]}"
    )
    return _reframe(text.encode())


def test_a_crafted_chain_within_the_bound_loads():
    g, _ = loads(_scan_chain(100))
    assert g.nodes[1].op.mnemonic == "scan"
    (out,) = g.evaluate({"x": np.float32(0.5)})
    assert out == np.exp(np.float32(0.5))


@pytest.mark.parametrize(
    "levels",
    # 10**5 levels: a 30 MB header, 2 to 4 s of json.loads; refused at entry MAX_NESTING
    [MAX_NESTING + 1, pytest.param(10**5, marks=pytest.mark.slow)],
)
def test_absurd_nesting_is_a_serialization_error(levels):
    with pytest.raises(SerializationError, match=f"nested more than {MAX_NESTING} deep"):
        loads(_scan_chain(levels))


def test_nesting_under_the_bound_but_too_deep_to_verify_is_a_serialization_error():
    with pytest.raises(SerializationError, match=r"nest \d+ deep, too deep to verify"):
        loads(_scan_chain(MAX_NESTING))


def test_absurd_nesting_in_a_version_1_file_is_a_serialization_error():
    """Version 1 nests sub-graphs in the JSON itself: 10**5 levels are refused (by the
    JSON parser's depth check or the decoder's), not a RecursionError."""
    text = '{"graph":' * 10**5 + "1" + "}" * 10**5
    with pytest.raises(SerializationError):
        loads(_reframe(('{"blobs":[],"params":[],"graph":' + text + "}").encode(), version=1))


# ---- the sub-graph table's own checks ------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda h: h["subgraphs"].append(h["subgraphs"][0]), r"entries \[2\] are used by no"),
        (lambda h: _ref(h["graph"], "else_branch").update(graph=0), "sub-graph 0 is used a"),
        (lambda h: _ref(h["graph"], "then_branch").update(graph=9), "sub-graph 9 is not an"),
        (lambda h: _ref(h["graph"], "then_branch").update(graph="0"), "sub-graph '0' is not"),
        (lambda h: h.pop("subgraphs"), "header lacks 'subgraphs'"),
    ],
)
def test_a_malformed_sub_graph_table_is_refused(edit, message):
    g = rlx.Graph("g")
    x = g.input("x", S)
    g.set_outputs(g.cond(g.constant(np.array(True)), lambda s, a: s.exp(a), lambda s, a: a, [x]))
    _, header, blobs = _frame(dumps(g))
    edit(header)
    with pytest.raises(SerializationError, match=message):
        loads(_reframe(header, blobs))


def test_a_sub_graph_cannot_name_itself_or_a_later_entry():
    g = _nested_ifs(3)
    _, header, blobs = _frame(dumps(g))
    subs = header["subgraphs"]
    last = max(k for k, e in enumerate(subs) if any(n["op"] == "if" for n in e["nodes"]))
    for k in (last, last + 1):  # itself (a loop), or a later entry
        _, header, blobs = _frame(dumps(g))
        _ref(header["subgraphs"][last], "then_branch")["graph"] = k
        with pytest.raises(SerializationError, match=f"sub-graph {k} is not an earlier entry"):
            loads(_reframe(header, blobs))


def _ref(graph_json: dict, attr: str) -> dict:
    """The ``{"graph": k}`` reference in attribute ``attr`` of the graph entry's If."""
    return next(n["attrs"][attr] for n in graph_json["nodes"] if n["op"] == "if")
