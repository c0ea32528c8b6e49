"""rlx.gguf.load vs gguf.GGUFReader and gguf.quants on files written by gguf.GGUFWriter:
every tensor type rlx maps (bytes, shapes, exact decode), metadata of every value type,
zero-copy packed views; every malformed file is a GgufError naming the thing."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rlx  # noqa: E402
from rlx.errors import GgufError, ModelError  # noqa: E402
from tests.frontends.gguf.blocks import LAYOUTS, PLAIN, finish, gguf, random_blocks, write
from tests.frontends.missing import error_without

ROWS = 3


def all_types_file(tmp_path):
    rng = np.random.default_rng(1)
    tensors = {}
    for i, t in enumerate(LAYOUTS):
        k = LAYOUTS[t][0] * 2
        tensors[f"w.{t}"] = (t, random_blocks(t, ROWS, k, seed=i))
    # a rank-3 block tensor: (2, 3, 64) in numpy order
    tensors["w3.Q8_0"] = ("Q8_0", random_blocks("Q8_0", 6, 64, seed=99).reshape(2, 3, -1))
    for t, dt in PLAIN.items():
        a = rng.standard_normal((ROWS, 5)) * (100 if t.startswith("I") else 1)
        tensors[f"p.{t}"] = (t, a.astype(dt))
    bf = rng.standard_normal((2, 4)).astype(np.float32).view(np.uint32) >> 16
    tensors["p.BF16"] = ("BF16", bf.astype("<u2").view(np.uint8))
    tensors["vec"] = ("F32", rng.standard_normal(7).astype(np.float32))
    path = write(tmp_path / "all.gguf", tensors, general__name="all types")
    return path, tensors


def test_every_mapped_type_matches_gguf_reader(tmp_path):
    path, written = all_types_file(tmp_path)
    f = rlx.gguf.load(path)
    ref = gguf.GGUFReader(path)
    assert list(f.tensors) == [t.name for t in ref.tensors] == list(written)
    for rt in ref.tensors:
        t = f.tensors[rt.name]
        assert t.type_name == rt.tensor_type.name
        assert t.shape == tuple(int(d) for d in reversed(rt.shape))
        assert t.data.tobytes() == rt.data.tobytes()
        assert t.offset == rt.data_offset
        assert not t.data.flags.writeable and not t.data.flags.owndata  # a view of the map
        got = t.dequantize()
        assert got.dtype == np.float32 and got.shape == t.shape
        if t.type_name in LAYOUTS:
            assert type(t.scheme).gguf_name == t.type_name
            (packed,) = t.packed()
            assert packed.dtype == np.uint8 and np.shares_memory(packed, t.data)
            assert packed.shape == (int(np.prod(t.shape[:-1])), t.data.shape[-1])
            if t.type_name == "Q8_K":  # gguf 0.19 has no Q8_K decoder: d * q by hand
                b = rt.data.reshape(-1, 292)
                d = b[:, :4].copy().view("<f4")
                want = (d * b[:, 4:260].view(np.int8)).reshape(t.shape)
            else:
                want = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(t.shape)
            np.testing.assert_array_equal(got, want)
        else:
            assert t.scheme is None
            with pytest.raises(GgufError, match=rt.name):
                t.packed()
            if t.type_name == "BF16":
                bits = written[rt.name][1].view("<u2").astype(np.uint32) << 16
                want = bits.view(np.float32).reshape(t.shape)
            else:
                want = written[rt.name][1].astype(np.float32)
            np.testing.assert_array_equal(got, want)


def test_metadata_of_every_value_type_matches_gguf_reader(tmp_path):
    path = tmp_path / "md.gguf"
    w = gguf.GGUFWriter(str(path), arch="gemma3")
    w.add_uint8("a.u8", 200)
    w.add_int8("a.i8", -5)
    w.add_uint16("a.u16", 60000)
    w.add_int16("a.i16", -30000)
    w.add_uint32("a.u32", 4_000_000_000)
    w.add_int32("a.i32", -7)
    w.add_float32("a.f32", 0.1)
    w.add_uint64("a.u64", 2**63 + 5)
    w.add_int64("a.i64", -(2**40))
    w.add_float64("a.f64", 1 / 3)
    w.add_bool("a.yes", True)
    w.add_string("a.s", "héllo ▁ 世界 🙂")
    w.add_array("a.strs", ["<s>", "", "▁the", "🙂"])
    w.add_array("a.ints", [1, -2, 3])
    w.add_array("a.floats", [0.5, -1.25])
    w.add_array("a.bools", [True, False, True])
    w.add_tensor("t", np.zeros(4, np.float32))
    finish(w)
    f = rlx.gguf.load(path)
    ref = gguf.GGUFReader(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(f.metadata) == keys
    for k in keys:
        assert f.metadata[k] == ref.fields[k].contents(), k
    assert f.architecture == "gemma3" and f.version == 3
    assert f.value_types["a.f32"] == "FLOAT32" and f.value_types["a.strs"] == "ARRAY[STRING]"
    assert f.metadata["a.bools"] == [True, False, True]
    assert isinstance(f.metadata["a.yes"], bool)
    assert f.metadata["a.f32"] == float(np.float32(0.1))


def test_rlx_gguf_without_the_gguf_package_names_the_llm_extra():
    out = error_without("gguf", "rlx.gguf")
    assert "ModelError" in out and "rlx[llm]" in out
    assert issubclass(GgufError, ModelError)


# -- malformed files ---------------------------------------------------------------------


def small_file(tmp_path, name="ok.gguf"):
    tensors = {
        "a.weight": ("Q4_K", random_blocks("Q4_K", 2, 256, seed=3)),
        "b.weight": ("Q8_0", random_blocks("Q8_0", 2, 64, seed=4)),
    }
    return write(tmp_path / name, tensors, general__name="small").read_bytes()


def dims_at(raw: bytes, tensor: str) -> int:
    """Offset of the first u64 dim of ``tensor``'s info in the header."""
    key = struct.pack("<Q", len(tensor)) + tensor.encode()
    at = raw.index(key) + len(key)
    return at + 4  # skip n_dims


def put(tmp_path, raw: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(raw)
    return p


def test_bad_magic_version_and_missing_file(tmp_path):
    raw = small_file(tmp_path)
    with pytest.raises(GgufError, match="not a GGUF file: magic b'GGML'"):
        rlx.gguf.load(put(tmp_path, b"GGML" + raw[4:]))
    with pytest.raises(GgufError, match="version 1"):
        rlx.gguf.load(put(tmp_path, raw[:4] + struct.pack("<I", 1) + raw[8:]))
    with pytest.raises(GgufError, match="big-endian"):
        rlx.gguf.load(put(tmp_path, raw[:4] + struct.pack(">I", 3) + raw[8:]))
    with pytest.raises(GgufError, match="cannot open"):
        rlx.gguf.load(tmp_path / "missing.gguf")
    with pytest.raises(GgufError, match="not a GGUF file"):
        rlx.gguf.load(put(tmp_path, b"hi"))


def test_every_truncation_is_a_gguf_error(tmp_path):
    raw = small_file(tmp_path)
    f = rlx.gguf.load(put(tmp_path, raw, "full.gguf"))
    header_end = f.data_offset
    cuts = sorted({*range(0, header_end, 3), *range(header_end, len(raw), 97)})
    for cut in cuts:
        with pytest.raises(GgufError, match="truncated|not a GGUF file|runs past the end"):
            rlx.gguf.load(put(tmp_path, raw[:cut]))


def test_tensor_byte_size_that_does_not_match_type_and_shape(tmp_path):
    raw = small_file(tmp_path)
    # a.weight (first tensor) declared with 3 rows: its bytes overlap b.weight's
    at = dims_at(raw, "a.weight") + 8
    bad = raw[:at] + struct.pack("<Q", 3) + raw[at + 8 :]
    with pytest.raises(GgufError, match="'a.weight'.*overlaps tensor 'b.weight'"):
        rlx.gguf.load(put(tmp_path, bad))
    # b.weight (last tensor) declared with 40 rows: runs past the end of the file
    at = dims_at(raw, "b.weight") + 8
    bad = raw[:at] + struct.pack("<Q", 40) + raw[at + 8 :]
    with pytest.raises(GgufError, match="'b.weight' \\(Q8_0 \\[40, 64\\].*past the end"):
        rlx.gguf.load(put(tmp_path, bad))
    # a Q4_K row of 100 weights is not whole blocks
    at = dims_at(raw, "a.weight")
    bad = raw[:at] + struct.pack("<Q", 100) + raw[at + 8 :]
    with pytest.raises(GgufError, match="'a.weight': Q4_K packs the last dim in blocks of 256"):
        rlx.gguf.load(put(tmp_path, bad))
    # an offset that breaks the alignment
    at = dims_at(raw, "b.weight") + 16 + 4
    off = struct.unpack_from("<Q", raw, at)[0]
    bad = raw[:at] + struct.pack("<Q", off + 1) + raw[at + 8 :]
    with pytest.raises(GgufError, match="'b.weight': data offset .* alignment 32"):
        rlx.gguf.load(put(tmp_path, bad))


def test_unsupported_and_unknown_types_name_the_tensor(tmp_path):
    iq = np.zeros((2, 18), np.uint8)  # IQ4_NL: 18 bytes per 32
    path = write(tmp_path / "iq.gguf", {"blk.0.ffn_up.weight": ("IQ4_NL", iq)})
    with pytest.raises(GgufError, match="'blk.0.ffn_up.weight': ggml type IQ4_NL .*not supported"):
        rlx.gguf.load(path)
    raw = small_file(tmp_path)
    at = dims_at(raw, "b.weight") + 16
    bad = raw[:at] + struct.pack("<I", 99) + raw[at + 4 :]
    with pytest.raises(GgufError, match="'b.weight': unknown ggml type id 99"):
        rlx.gguf.load(put(tmp_path, bad))


_VALUES = st.one_of(
    st.text(max_size=20),
    st.integers(-(2**31), 2**31 - 1),
    st.floats(width=32, allow_nan=False),
    st.booleans(),
    st.lists(st.text(max_size=8), min_size=1, max_size=6),
    st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=6),
)


@given(st.dictionaries(st.text("abcxyz._", min_size=1, max_size=12), _VALUES, max_size=8))
@settings(max_examples=30, deadline=None)
def test_random_metadata_reads_as_gguf_reader_does(tmp_path_factory, md):
    path = tmp_path_factory.mktemp("md") / "r.gguf"
    w = gguf.GGUFWriter(str(path), arch="x")
    for k, v in md.items():
        if k != "general.architecture":
            w.add_key_value(k, v, gguf.GGUFValueType.get_type(v))
    w.add_tensor("t", np.zeros(2, np.float32))
    finish(w)
    f = rlx.gguf.load(path)
    ref = gguf.GGUFReader(path)
    assert f.metadata == {k: ref.fields[k].contents() for k in ref.fields if k[:5] != "GGUF."}


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_corrupted_header_bytes_load_or_raise_gguf_error(tmp_path_factory, data):
    """Any bytes of the header overwritten: load succeeds or raises GgufError, never
    another exception."""
    d = tmp_path_factory.mktemp("fuzz")
    raw = bytearray(small_file(d))
    end = rlx.gguf.load(put(d, bytes(raw), "ok.gguf")).data_offset
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, end - 1))
        raw[at] = data.draw(st.integers(0, 255))
    try:
        rlx.gguf.load(put(d, bytes(raw)))
    except GgufError:
        pass


def test_deeply_nested_arrays_are_refused(tmp_path):
    raw = bytearray(b"GGUF" + struct.pack("<IQQ", 3, 0, 1))
    raw += struct.pack("<Q", 1) + b"k" + struct.pack("<I", 9)
    raw += (struct.pack("<I", 9) + struct.pack("<Q", 1)) * 20 + struct.pack("<IQ", 4, 0)
    with pytest.raises(GgufError, match="'k\\[0\\].*nested deeper than 8"):
        rlx.gguf.load(put(tmp_path, bytes(raw)))
