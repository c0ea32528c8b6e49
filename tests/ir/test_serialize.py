"""Graph files: exact round trips (fingerprint, params bit for bit), every registered op,
an op unknown to serialize.py, and every way a file can be damaged."""

import dataclasses
import enum
import hashlib
import itertools
import json
import struct
import sys
from typing import ClassVar

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx import DType, Shape
from rlx.errors import InputError, SerializationError, VerifyError
from rlx.ir.serialize import FORMAT_VERSION, MAGIC, dumps, load, loads, save
from rlx.ops import OPS
from rlx.ops.base import Op, register
from rlx.ops.custom import register_custom_op, unregister_custom_op
from rlx.ops.fused import Activation

# ---- helpers -------------------------------------------------------------------------


def _frame(data: bytes) -> tuple[dict, bytes]:
    """Split a file into its JSON header and blob section."""
    _, _, hl, bl = struct.unpack_from("<4sIQQ", data)
    return json.loads(data[24 : 24 + hl]), data[24 + hl : 24 + hl + bl]


def _reframe(header: dict, blobs: bytes, version: int = FORMAT_VERSION) -> bytes:
    """A well-framed file (right lengths and checksum) around ``header`` and ``blobs``."""
    text = json.dumps(header).encode()
    body = struct.pack("<4sIQQ", MAGIC, version, len(text), len(blobs)) + text + blobs
    return body + hashlib.sha256(body).digest()


def _assert_same(g1: rlx.Graph, g2: rlx.Graph) -> None:
    assert g2 == g1
    assert g2.fingerprint() == g1.fingerprint()
    assert g2.name == g1.name and g2.inspect() == g1.inspect()


def _bits(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def _rich_graph() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """One graph with fused and control ops, sub-graphs holding constants, symbolic dims
    with bounds, constants of many dtypes, and params in f32, bf16 and fp8."""
    g = rlx.Graph("rich")
    b = g.sym("batch", min=1, max=32)
    x = g.input("x", (b, 8))
    w = g.param("w", (8, 8))
    gamma = g.param("gamma", (8,), "bf16")
    qw = g.param("qw", (4, 2), "f8e4m3")
    g.param("qw5", (3,), "f8e5m2")
    h = g.fused_matmul_bias_act(
        x, w, g.constant(np.linspace(-1, 1, 8, dtype=np.float32)), Activation.GELU
    )
    h = g.fused_residual_layer_norm(h, x, g.constant(np.ones(8, np.float32)), eps=1e-5)
    h = g.fused_residual_rms_norm(h, x, g.cast(gamma, "f32"), eps=1.0 / 3.0)
    r = g.elementwise_region([h, x], lambda s, a, c: s.tanh(s.mul(s.add(a, c), 0.1)))
    pred = g.constant(np.array(False))
    cnd = g.cond(
        pred, lambda s, a: s.exp(a), lambda s, a: s.sub(a, s.constant(np.float32(3.25))), [r]
    )
    loop = g.while_loop(
        lambda s, i, a: s.lt(i, s.constant(np.float32(3))),
        lambda s, i, a: [s.add(i, 1.0), s.mul(a, 0.5)],
        [g.constant(np.float32(0)), cnd],
        output_index=1,
        max_iterations=10,
    )
    scan = g.scan(
        lambda s, c, t: [s.add(c, t), s.relu(c)],
        [g.constant(np.zeros(8, np.float32))],
        [loop],
        output_index=1,
        reverse=True,
    )
    consts = [
        g.constant(np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)),
        g.constant(np.array([0.5, -448.0], dtype=ml_dtypes.float8_e4m3fn)),
        g.constant(np.array([1 + 2j], np.complex64)),
        g.constant(np.array([2**40, -1], np.int64)),
        g.constant(np.array([[True, False]])),
        g.constant(np.zeros((0, 3), np.float16)),
        g.constant(np.float64(np.nan)),
        g.constant(np.array([-0.0, np.inf], np.float32)),
    ]
    g.set_outputs([scan, qw, *consts])
    g.verify()
    rng = np.random.default_rng(0)
    params = {
        "w": rng.standard_normal((8, 8)).astype(np.float32),
        "gamma": rng.standard_normal(8).astype(ml_dtypes.bfloat16),
        "qw": rng.standard_normal((4, 2)).astype(ml_dtypes.float8_e4m3fn),
        "qw5": np.array([np.nan, -0.0, 57344.0], dtype=ml_dtypes.float8_e5m2),
    }
    return g, params


# ---- round trips ---------------------------------------------------------------------


def test_round_trip_is_exact_for_graph_and_params(tmp_path):
    g, params = _rich_graph()
    path = tmp_path / "model.rlx"
    save(g, path, params)
    g2, p2 = load(path)
    _assert_same(g, g2)
    assert sorted(p2) == sorted(params)
    for k, v in params.items():
        assert p2[k].dtype == v.dtype and p2[k].shape == v.shape
        assert _bits(p2[k]) == _bits(v), k
        assert p2[k].flags.writeable
    assert g2.nodes[0].loc == g.nodes[0].loc and g2.sym_bounds == {"batch": (1, 32)}
    feed = {"x": np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)}
    for a, b in zip(g.evaluate(feed, params), g2.evaluate(feed, p2)):
        assert _bits(a) == _bits(b)
    assert dumps(g2, p2) == dumps(g, params)  # deterministic bytes
    assert list(tmp_path.iterdir()) == [path]  # the atomic write left no temp file


def test_file_layout_is_aligned_and_locations_are_optional():
    g, params = _rich_graph()
    data = dumps(g, params, locations=False)
    assert data[:4] == MAGIC and struct.unpack_from("<I", data, 4)[0] == FORMAT_VERSION
    header, blobs = _frame(data)
    assert (24 + struct.unpack_from("<Q", data, 8)[0]) % 64 == 0
    assert all(off % 64 == 0 for off, _ in header["blobs"])
    assert len(data) == 24 + struct.unpack_from("<Q", data, 8)[0] + len(blobs) + 32
    g2, _ = loads(data)
    _assert_same(g, g2)
    assert all(n.loc is None for n in g2.nodes)
    assert loads(dumps(g))[1] == {}


def test_a_graph_module_is_saved_as_its_mir_graph():
    m = rlx.GraphModule.from_graph(_rich_graph()[0])
    g2, _ = loads(dumps(m))
    _assert_same(m.into_graph(), g2)
    with pytest.raises(SerializationError, match="takes a Graph or a GraphModule, got str"):
        dumps("graph")


def test_identical_constants_share_one_blob():
    g = rlx.Graph("g")
    k = np.arange(100, dtype=np.float32)
    g.set_outputs([g.add(g.constant(k), g.constant(k.copy()))])
    header, _ = _frame(dumps(g))
    assert len(header["blobs"]) == 1


_BY_ANNOTATION = {
    "int": [1, 0],
    "float": [0.5],
    "int | None": [None, 0],
    "tuple[int, ...]": [(0,), (1, 0), (2, 2)],
    "tuple[float, ...]": [(0.5,)],
    "tuple[Dim, ...]": [(4, 4), (16,)],
    "tuple[int | None, ...]": [(0, None)],
    "tuple[tuple[int, int], ...]": [((0, 0), (1, 1)), ((1, 0),)],
}


def _candidates(cls: type[Op]) -> list[dict]:
    """Attribute sets to try: defaults, every member of an enum-typed field, and a few
    plain values per annotation (ints, floats, tuples) for the rest."""
    mod = sys.modules[cls.__module__]
    per_field = []
    for f in dataclasses.fields(cls):
        t = getattr(mod, str(f.type), None)
        if f.default is not dataclasses.MISSING:
            per_field.append([f.default])
        elif isinstance(t, type) and issubclass(t, enum.Enum):
            per_field.append(list(t)[:8])
        elif f.type in _BY_ANNOTATION:
            per_field.append(_BY_ANNOTATION[f.type])
        else:
            return []
    names = [f.name for f in dataclasses.fields(cls)]
    combos = itertools.islice(itertools.product(*per_field), 64)
    return [dict(zip(names, combo)) for combo in combos]


_POOL = [
    Shape((4, 4)),
    Shape((4,)),
    Shape((2, 4, 4)),
    Shape((4, 4), "bool"),
    Shape((4,), "i64"),
    Shape((4,), "i32"),
]


_MAX_TRIES = 50_000


def _first_signature(op: Op) -> tuple[Shape, ...] | None:
    n = op.num_inputs()
    for arity in [n] if n is not None else [1, 2, 3, 4]:
        # the first _MAX_TRIES combinations only: an op with many inputs (the fused
        # blocks take 11-19) has too many to enumerate, and is round-tripped by its own tests
        for ins in itertools.islice(itertools.product(_POOL, repeat=arity), _MAX_TRIES):
            try:
                op.infer(ins)
                return ins
            except rlx.RlxError:
                continue
    return None


def test_every_registered_op_buildable_from_its_attributes_round_trips():
    done = set()
    for mnemonic, cls in OPS.items():
        for attrs in _candidates(cls):
            try:
                op = cls(**attrs)
            except (rlx.RlxError, TypeError, ValueError):
                continue
            ins = _first_signature(op)
            if ins is None:
                continue
            g = rlx.Graph(f"one_{mnemonic}")
            ids = [g.input(f"x{k}", s) for k, s in enumerate(ins)]
            g.set_outputs(g.apply(op, ids))
            g2, _ = loads(dumps(g))
            _assert_same(g, g2)
            assert g2.nodes[-1].op == op
            done.add(mnemonic)
    expected = {
        "unary", "binary", "compare", "where", "cast", "matmul", "softmax", "layer_norm",
        "rms_norm", "fused_matmul_bias_act", "fused_swiglu", "fused_residual_rms_norm",
        "fused_residual_layer_norm",
    }  # fmt: skip
    assert expected <= done, expected - done
    assert len(done) >= 30, sorted(done)


class Flavor(enum.Enum):
    SWEET = "sweet"
    SOUR = "sour"


@dataclasses.dataclass(frozen=True)
class Recipe:
    flavor: Flavor
    weights: tuple[float, ...]
    dtype: DType = DType.BF16


def test_an_op_serialize_py_has_never_seen_round_trips():
    @register
    class TestOnlyFancy(Op):
        """An op defined here: its enum and dataclass attributes live in this module."""

        mnemonic: ClassVar[str] = "test_only_fancy"
        arity: ClassVar[int] = 1
        recipe: Recipe
        dims: tuple[int | rlx.shape.Sym, ...]
        shape: Shape
        nothing: None = None
        ratio: float = 0.1
        label: str = 'é\n"quoted"'
        flag: bool = True
        big: int = -(2**70)

        def infer(self, ins):
            return ins[0]

        def reference(self, xs, ctx):
            return xs[0]

    try:
        g = rlx.Graph("new")
        seq = g.sym("seq")
        x = g.input("x", (seq, 2))
        op = TestOnlyFancy(
            Recipe(Flavor.SOUR, (1.0, float("inf"), -0.0, 5e-324)),
            (seq * 2, 3, rlx.sym("a") * rlx.sym("b")),
            Shape((seq, 4), "f8e5m2"),
        )
        g.set_outputs(g.apply(op, [x]))
        g2, _ = loads(dumps(g))
        _assert_same(g, g2)
        assert g2.nodes[1].op == op and str(g2.nodes[1].op.ratio) == "0.1"
    finally:
        del OPS["test_only_fancy"]


def test_rlx_dataclass_and_enum_attributes_round_trip():
    from rlx.ops.nn import Attention, MaskKind
    from rlx.ops.quant import DequantMatMul, Int8Block

    g = rlx.Graph("g")
    q = g.input("q", (1, 3, 8))
    kv = g.input("kv", (1, 5, 8))
    att = g.apply(Attention(2, 4, MaskKind.sliding_window(2)), [q, kv, kv])
    x = g.input("x", (2, 8))
    wq = g.param("wq", (3, 8), "i8")
    sc = g.param("sc", (3, 2))
    zp = g.param("zp", (3, 2), "i32")
    dq = g.apply(DequantMatMul(Int8Block(4)), [x, wq, sc, zp])
    g.set_outputs([att, dq])
    params = {
        "wq": np.arange(24, dtype=np.int8).reshape(3, 8),
        "sc": np.ones((3, 2), np.float32),
        "zp": np.zeros((3, 2), np.int32),
    }
    g2, p2 = loads(dumps(g, params))
    _assert_same(g, g2)
    assert g2.nodes[att].op.mask == MaskKind.sliding_window(2)
    assert all(_bits(p2[k]) == _bits(v) for k, v in params.items())


# ---- damaged files ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def good() -> bytes:
    g, params = _rich_graph()
    return dumps(g, params)


@given(st.data())
def test_truncated_files_say_where(good, data):
    cut = data.draw(st.integers(0, len(good) - 1))
    with pytest.raises(SerializationError, match=f"truncated at byte {cut}\\b"):
        loads(good[:cut])


@given(st.data())
def test_flipped_bytes_are_detected(good, data):
    pos = data.draw(st.integers(0, len(good) - 1))
    bad = bytearray(good)
    bad[pos] ^= data.draw(st.integers(1, 255))
    with pytest.raises(SerializationError):
        loads(bytes(bad))


def test_each_framing_error_names_itself(good):
    with pytest.raises(SerializationError, match="not an rlx graph file"):
        loads(b"PK\x03\x04" + good[4:])
    future = bytearray(good)
    future[4:8] = struct.pack("<I", 7)
    with pytest.raises(
        SerializationError, match=r"unsupported version 7 \(this build reads 1, 2\)"
    ):
        loads(bytes(future))
    with pytest.raises(SerializationError, match="checksum mismatch"):
        loads(good[:-1] + bytes([good[-1] ^ 1]))
    with pytest.raises(SerializationError, match="3 unexpected bytes after the checksum"):
        loads(good + b"abc")
    with pytest.raises(SerializationError, match="truncated at byte 0"):
        loads(b"")


def test_unknown_op_and_malformed_headers(good):
    header, blobs = _frame(good)
    header["graph"]["nodes"][1]["op"] = "x"
    with pytest.raises(SerializationError, match="unknown op 'x'"):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    header["graph"]["nodes"][0]["attrs"]["color"] = "red"
    with pytest.raises(
        SerializationError, match=r"node %0 \(input\): Input has no attributes \['color'\]"
    ):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    header["blobs"][0] = [len(blobs), 64]
    with pytest.raises(SerializationError, match="runs past the end of the blob section"):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    del header["graph"]["outputs"]
    with pytest.raises(SerializationError, match="lacks 'outputs'"):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    header["graph"]["nodes"][0]["shape"]["dtype"] = "f128"
    with pytest.raises(SerializationError, match="unknown dtype 'f128'"):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    header["graph"]["nodes"][-1]["inputs"] = [10_000]
    with pytest.raises(SerializationError, match="the saved graph is invalid"):
        loads(_reframe(header, blobs))
    with pytest.raises(SerializationError, match="not valid JSON"):
        loads(_raw(b"{nope"))
    with pytest.raises(SerializationError, match="must be a JSON object"):
        loads(_raw(b"[1, 2]"))


def _raw(text: bytes) -> bytes:
    body = struct.pack("<4sIQQ", MAGIC, FORMAT_VERSION, len(text), 0) + text
    return body + hashlib.sha256(body).digest()


def test_stored_values_are_checked_against_the_graph(good):
    header, blobs = _frame(good)
    for n in header["graph"]["nodes"]:
        if n["op"] == "input":
            n["attrs"]["shape"]["shape"]["dtype"] = "f16"  # the recorded shape stays f32
    with pytest.raises(SerializationError, match="recorded shape"):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    header["params"][0]["dims"] = [2, 2]
    with pytest.raises(
        SerializationError, match=r"param 'w': blob \d+ holds 256 bytes, expected 16"
    ):
        loads(_reframe(header, blobs))
    header, blobs = _frame(good)
    enum_attr = next(n for n in header["graph"]["nodes"] if n["op"] == "fused_matmul_bias_act")
    enum_attr["attrs"]["act"] = {"enum": "UnaryKind", "member": "SPARKLE"}
    with pytest.raises(SerializationError, match="UnaryKind has no member 'SPARKLE'"):
        loads(_reframe(header, blobs))
    enum_attr["attrs"]["act"] = {"enum": "Popen", "member": "x"}
    with pytest.raises(SerializationError, match="unknown class 'Popen'"):
        loads(_reframe(header, blobs))


# ---- save-side errors ------------------------------------------------------------------


def test_save_rejects_what_a_file_cannot_hold(tmp_path):
    register_custom_op("t_ser_id", lambda ins, a: ins[0], lambda xs, a, c: xs[0], arity=1)
    try:
        g = rlx.Graph("g")
        x = g.input("x", (2,))
        g.set_outputs(g.custom("t_ser_id", [x], tags=frozenset({"a"})))
        with pytest.raises(
            SerializationError, match="cannot store a value of type builtins.frozenset"
        ):
            dumps(g)
    finally:
        unregister_custom_op("t_ser_id")
    g, params = _rich_graph()
    with pytest.raises(InputError, match="unknown param 'nope'"):
        dumps(g, {"nope": np.zeros(1)})
    with pytest.raises(InputError, match=r"param 'w': expected f32\[8,8\], given shape \(8, 7\)"):
        dumps(g, {"w": np.zeros((8, 7), np.float32)})
    with pytest.raises(
        InputError, match=r"param 'w': expected dtype f32 \(f32\[8,8\]\), given complex64"
    ):
        dumps(g, {"w": np.zeros((8, 8), np.complex64)})
    # the runtime's lossless rule (set_param): f64 -> f32 is refused, not rounded silently
    with pytest.raises(InputError, match="given float64 array"):
        dumps(g, {"w": np.ones((8, 8))})
    unset = rlx.Graph("no_outputs")
    unset.input("x", (1,))
    with pytest.raises(VerifyError, match="no outputs"):
        dumps(unset)
    with pytest.raises(SerializationError, match="cannot read"):
        load(tmp_path / "missing.rlx")
    with pytest.raises(SerializationError, match="cannot write"):
        save(g, tmp_path / "no_dir" / "m.rlx")
    bad = tmp_path / "bad.rlx"
    bad.write_bytes(b"RLXG")
    with pytest.raises(SerializationError, match="bad.rlx.*truncated at byte 4"):
        load(bad)
