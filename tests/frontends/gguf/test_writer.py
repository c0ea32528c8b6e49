"""rlx.gguf.save: every scheme rlx packs, read back by gguf.GGUFReader (bytes equal to
gguf.quants.quantize for the legacy types, F16 and BF16; decode equal to
gguf.quants.dequantize; error within the scheme's step) and by rlx.gguf.load; per-tensor
schemes, metadata of every type, a loaded file copied unchanged, an rlx graph's weights
run through DequantMatMul; bad requests are GgufErrors and leave no file."""

from __future__ import annotations

import numpy as np
import pytest

import rlx
from rlx.errors import GgufError
from rlx.formats.schemes import GGUF_SCHEMES, GgufQ6K, Int8Block
from rlx.frontends.gguf import save, save_graph_weights
from rlx.quant.pack import pack
from tests.frontends.gguf.blocks import gguf

QT = gguf.GGMLQuantizationType
#: scheme -> bound on max |decoded - w| / max |w| per block row (step of the scheme)
SCHEMES = {
    "Q8_0": 1 / 127, "Q4_0": 1 / 8, "Q4_1": 1 / 15, "Q5_0": 1 / 16, "Q5_1": 1 / 31,
    "Q4_K": 2 / 15, "Q5_K": 2 / 31, "Q6_K": 2 / 31, "Q8_K": 1 / 127,
    "F16": 2**-10, "BF16": 2**-7, "F32": 0.0,
}  # fmt: skip
ORACLE_BYTES = {"Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "F16", "BF16"}


def weights(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "blk.0.w": rng.standard_normal((6, 512)).astype(np.float32),
        "blk.0.w3": rng.standard_normal((2, 3, 256)).astype(np.float32) * 0.02,
        "blk.0.norm": rng.standard_normal(512).astype(np.float32),
    }


@pytest.mark.parametrize("tname", list(SCHEMES))
def test_every_scheme_round_trips_bit_exactly(tmp_path, tname):
    ws = weights()
    path = tmp_path / "m.gguf"
    written = save(path, ws, scheme=tname)
    assert written == {"blk.0.w": tname, "blk.0.w3": tname, "blk.0.norm": "F32"}
    ref = {t.name: t for t in gguf.GGUFReader(path).tensors}
    f = rlx.gguf.load(path)
    for name, w in ws.items():
        rt, t = ref[name], f.tensors[name]
        assert rt.tensor_type.name == t.type_name == written[name]
        assert tuple(int(d) for d in reversed(rt.shape)) == t.shape == w.shape
        assert t.data.tobytes() == rt.data.tobytes()
        got = t.dequantize()
        if written[name] == "F32":
            np.testing.assert_array_equal(got, w)
            continue
        if tname in ORACLE_BYTES:  # llama.cpp's own quantizer, byte for byte
            want = gguf.quants.quantize(w.reshape(-1, w.shape[-1]), QT[tname])
            assert rt.data.tobytes() == want.tobytes()
        if tname in GGUF_SCHEMES:
            (packed,) = pack(GGUF_SCHEMES[tname](), w.reshape(-1, w.shape[-1]))
            assert rt.data.tobytes() == packed.tobytes()
            np.testing.assert_array_equal(t.packed()[0], packed)
        if tname != "Q8_K":  # gguf 0.19 has no Q8_K decoder (tests/quant covers it)
            oracle = gguf.quants.dequantize(rt.data, rt.tensor_type).reshape(w.shape)
            np.testing.assert_array_equal(got, oracle)
        rows = w.reshape(-1, w.shape[-1])
        err = np.abs(got.reshape(rows.shape) - rows).max(-1)
        assert (err <= SCHEMES[tname] * np.abs(rows).max(-1) * 1.0001).all()


def test_per_tensor_schemes_and_fallback(tmp_path):
    rng = np.random.default_rng(2)
    ws = {
        "a": rng.standard_normal((4, 256)).astype(np.float32),
        "b": rng.standard_normal((4, 256)).astype(np.float32),
        "c": rng.standard_normal((4, 256)).astype(np.float32),
        "d": rng.standard_normal((4, 640)).astype(np.float32),  # K = 640: no Q4_K
        "ids": np.arange(10, dtype=np.int32),
        "h": rng.standard_normal((4, 64)).astype(np.float16),
    }
    path = tmp_path / "m.gguf"
    written = save(path, ws, "Q4_K", schemes={"a": "Q8_0", "b": None, "c": GgufQ6K()})
    assert written == {"a": "Q8_0", "b": "F32", "c": "Q6_K", "d": "F32", "ids": "I32", "h": "F32"}
    assert [t.tensor_type.name for t in gguf.GGUFReader(path).tensors] == list(written.values())
    f = rlx.gguf.load(path)
    np.testing.assert_array_equal(f.tensors["ids"].data, ws["ids"])
    written = save(tmp_path / "plain.gguf", {"h": ws["h"], "d": ws["d"]})
    assert written == {"h": "F16", "d": "F32"}


def test_bad_requests_are_errors_and_leave_no_file(tmp_path):
    w = {"w": np.ones((2, 640), np.float32)}
    path = tmp_path / "m.gguf"
    path.write_bytes(b"old")
    cases = [
        (dict(schemes={"w": "Q4_K"}), "'w' \\[2, 640\\]: K=640 is not a multiple .* 256"),
        (dict(schemes={"w": "Q2_K"}), "'w' \\[2, 640\\]: GgufQ2K has no packer"),
        (dict(schemes={"x": "Q8_0"}), "schemes name tensors that are not given: \\['x'\\]"),
        (dict(scheme=Int8Block(32)), "'w': Int8Block\\(32\\) is not a GGUF scheme"),
        (dict(scheme="Q7"), "'w': scheme 'Q7' is not a GGUF type"),
        (dict(metadata={"k": []}), "metadata 'k': GGUF cannot hold an empty array"),
        (dict(metadata={"k": {"a": 1}}), "metadata 'k': GGUF cannot hold a dict"),
        (dict(metadata={"k": [1, "a"]}), "metadata 'k': a GGUF array holds one type"),
        (dict(metadata={"k": 300}, metadata_types={"k": "UINT8"}), "300 does not fit UINT8"),
        (dict(metadata={"k": [1.5]}, metadata_types={"k": "ARRAY[INT32]"}), "1.5 does not"),
        (dict(metadata={"k": 1}, metadata_types={"k": "BOOL"}), "1 is not a BOOL"),
        (dict(metadata={"k": 1}, metadata_types={"k": "ARRAY"}), "type 'ARRAY' cannot be"),
    ]
    for kwargs, match in cases:
        with pytest.raises(GgufError, match=match):
            save(path, w, **kwargs)
    bad = {"w": np.full((2, 64), np.nan, np.float32)}
    with pytest.raises(GgufError, match="cannot write tensor 'w' as Q8_0: .*NaN"):
        save(path, bad, "Q8_0")
    assert path.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["m.gguf"]


def test_metadata_of_every_type_and_a_loaded_file_copied_unchanged(tmp_path):
    md = {
        "general.architecture": "llama",
        "general.name": "tiny ▁ 世界",
        "llama.block_count": 2,
        "llama.rope.freq_base": 10000.0,
        "neg": -3,
        "mixed": [1, -2, 3],
        "big": 2**40,
        "flag": True,
        "tokenizer.ggml.tokens": ["<s>", "▁a", "🙂"],
        "tokenizer.ggml.scores": [0.0, -1.5, -2.0],
        "tokenizer.ggml.token_type": [3, 1, 1],
    }
    src = tmp_path / "src.gguf"
    save(src, weights(), "Q5_K", metadata=md)
    f = rlx.gguf.load(src)
    assert f.metadata == {**md, "general.quantization_version": 2}
    assert f.value_types["llama.block_count"] == "UINT32" and f.value_types["neg"] == "INT32"
    assert (
        f.value_types["mixed"] == "ARRAY[INT32]"
        and f.value_types["big"] == "INT64"
        and f.value_types["tokenizer.ggml.scores"] == ("ARRAY[FLOAT32]")
    )
    ref = gguf.GGUFReader(src)
    for k in md:
        assert ref.fields[k].contents() == f.metadata[k], k
    # copy: GgufTensors are written with their own bytes, metadata with its own types
    dst = tmp_path / "dst.gguf"
    save(dst, f.tensors, metadata=f.metadata, metadata_types={**f.value_types, "neg": "INT64"})
    g = rlx.gguf.load(dst)
    assert g.metadata == f.metadata and g.value_types == {**f.value_types, "neg": "INT64"}
    for name, t in f.tensors.items():
        u = g.tensors[name]
        assert (u.type_name, u.shape, u.data.tobytes()) == (t.type_name, t.shape, t.data.tobytes())
    # re-quantize a loaded tensor with a new scheme
    save(tmp_path / "re.gguf", f.tensors, "Q8_0")
    h = rlx.gguf.load(tmp_path / "re.gguf")
    assert h.tensors["blk.0.w"].type_name == "Q8_0"
    want = gguf.quants.quantize(f.tensors["blk.0.w"].dequantize(), QT.Q8_0)
    assert h.tensors["blk.0.w"].data.tobytes() == want.tobytes()


def test_graph_weights_saved_transposed_run_through_dequant_matmul(tmp_path, monkeypatch):
    monkeypatch.setenv("RLX_DQ_ACT", "f32")
    rng = np.random.default_rng(5)
    params = {
        "w1": rng.standard_normal((256, 64)).astype(np.float32) * 0.1,
        "b1": rng.standard_normal(64).astype(np.float32),
    }
    g = rlx.Graph("mlp")
    x = g.input("x", (3, 256))
    y = g.add(g.matmul(x, g.param("w1", (256, 64))), g.param("b1", (64,)))
    g.set_outputs([y])
    path = tmp_path / "g.gguf"
    written = save_graph_weights(path, g, params, "Q8_0")
    assert written == {"w1": "Q8_0", "b1": "F32"}
    f = rlx.gguf.load(path)
    w = f.tensors["w1"]
    assert w.shape == (64, 256)  # (out, in): y = x @ W.T
    (packed,) = w.packed()
    assert packed.tobytes() == gguf.quants.quantize(params["w1"].T, QT.Q8_0).tobytes()
    h = rlx.Graph("dq")
    xi = h.input("x", (3, 256))
    h.set_outputs([h.dequant_matmul(xi, w.scheme, h.constant(np.array(packed)))])
    xv = rng.standard_normal((3, 256)).astype(np.float32)
    (got,) = rlx.Session("cpu").compile(h).run({"x": xv})
    want = xv @ gguf.quants.dequantize(packed, QT.Q8_0).T
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(f.tensors["b1"].data, params["b1"])
