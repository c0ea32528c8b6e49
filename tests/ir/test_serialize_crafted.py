"""Graph files an attacker (or a broken writer) made: sizes that do not add up are refused
before the bulk of the file is read, and a file that passes its checksum but holds values
no writer produces is a SerializationError naming the node, op and attribute, at load
time, not a bare exception when the graph later runs."""

import hashlib
import json
import struct
import tracemalloc

import numpy as np
import pytest

import rlx
from rlx.errors import SerializationError
from rlx.ir.serialize import FORMAT_VERSION, MAGIC, dumps, load, loads, save

_MB = 1 << 20


def _frame(data: bytes) -> tuple[dict, bytes]:
    _, _, hl, bl = struct.unpack_from("<4sIQQ", data)
    return json.loads(data[24 : 24 + hl]), data[24 + hl : 24 + hl + bl]


def _reframe(header: dict, blobs: bytes) -> bytes:
    """A well-framed file (right lengths and checksum) around ``header`` and ``blobs``."""
    text = json.dumps(header).encode()
    body = struct.pack("<4sIQQ", MAGIC, FORMAT_VERSION, len(text), len(blobs)) + text + blobs
    return body + hashlib.sha256(body).digest()


def _graph() -> rlx.Graph:
    g = rlx.Graph("g")
    b = g.sym("batch", max=8)
    x = g.input("x", (b, 4))
    h = g.layer_norm(g.cast(x, "f32"), g.constant(np.arange(4, dtype=np.float32)))
    h = g.add(h, g.constant(np.linspace(0, 1, 12, dtype=np.float32)[:4]))
    g.set_outputs(g.reshape(g.softmax(h, axis=-1), (b, 2, 2)))
    return g


def _peak_while(fn) -> tuple[BaseException, int]:
    """The exception ``fn`` raises and the peak bytes Python allocated meanwhile."""
    tracemalloc.start()
    try:
        with pytest.raises(SerializationError) as info:
            fn()
        return info.value, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ---- sizes (fault: a padded file was read whole before its sizes were checked) --------


def test_a_file_padded_to_4_gib_is_refused_without_reading_the_padding(tmp_path):
    path = tmp_path / "padded.rlx"
    save(_graph(), path)
    size = path.stat().st_size
    with open(path, "r+b") as f:
        f.truncate(4 << 30)  # a sparse tail: no disk used
    err, peak = _peak_while(lambda: load(path))
    assert f"{(4 << 30) - size} unexpected bytes after the checksum" in str(err)
    assert peak < 4 * _MB, peak


def test_an_inflated_blob_section_is_refused_before_it_is_read(tmp_path):
    """The prelude claims 1 GiB of blobs and the file is that long (sparse), but the blob
    table accounts for 64 bytes: refused after reading the header only."""
    header, blobs = _frame(dumps(_graph()))
    text = json.dumps(header).encode()
    blob_len = 1 << 30
    path = tmp_path / "inflated.rlx"
    with open(path, "wb") as f:
        f.write(struct.pack("<4sIQQ", MAGIC, FORMAT_VERSION, len(text), blob_len) + text)
        f.write(blobs)
        f.truncate(24 + len(text) + blob_len + 32)
    err, peak = _peak_while(lambda: load(path))
    assert f"the blob section is {blob_len} bytes but its table accounts for" in str(err)
    assert "do not add up" in str(err)
    assert peak < 4 * _MB, peak


def test_blob_room_the_table_does_not_account_for_is_refused():
    header, blobs = _frame(dumps(_graph()))
    with pytest.raises(
        SerializationError, match="blob section is 1152 bytes but its table accounts for 128"
    ):
        loads(_reframe(header, blobs + bytes(1024)))  # checksum right, 1 KiB of nothing
    header["blobs"][1][0] += 64
    with pytest.raises(SerializationError, match="blob 1 starts at offset 128, expected 64"):
        loads(_reframe(header, blobs + bytes(64)))


def test_what_is_still_read_is_what_the_file_declares(tmp_path):
    """A valid file loads from disk with a peak allocation of about its own size."""
    g = rlx.Graph("big")
    w = g.param("w", (512, 512))
    g.set_outputs(g.matmul(g.input("x", (2, 512)), w))
    params = {"w": np.ones((512, 512), np.float32)}
    path = tmp_path / "big.rlx"
    save(g, path, params)
    tracemalloc.start()
    try:
        g2, p2 = load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert g2 == g and np.array_equal(p2["w"], params["w"])
    assert peak < 2.5 * path.stat().st_size, (peak, path.stat().st_size)


# ---- values (fault: crafted values loaded, then failed with non-rlx exceptions) -------


def _crafted(edit) -> bytes:
    """The file of ``_graph()`` with ``edit(header_json_text) -> text`` applied, re-framed
    so the checksum passes."""
    header, blobs = _frame(dumps(_graph(), locations=False))
    return _reframe(json.loads(edit(json.dumps(header))), blobs)


_SYM = '{"coeff": 1, "sym": [["batch", 1]]}'


@pytest.mark.parametrize(
    "old, new, message",
    [
        # a symbolic dim with coefficient 0 divided by zero when the graph ran
        (_SYM, _SYM.replace('"coeff": 1', '"coeff": 0'), r"coefficient must be an int >= 1"),
        (_SYM, _SYM.replace("1]]", "-1]]"), r"power of 'batch' must be an int >= 1, got -1"),
        # a crafted power made evaluating the dim (value ** power) run forever
        (
            _SYM,
            _SYM.replace("1]]", "1000000000000]]"),
            r"power 1000000000000 of 'batch' is above 64",
        ),
        (
            _SYM,
            _SYM.replace('"coeff": 1', f'"coeff": {2**62}'),
            r"coefficient 4611686018427387904 >= 2\*\*62",
        ),
        (
            '"dims": {"tuple": [' + _SYM,
            '"dims": {"tuple": [{"dataclass": "Sym", "fields": {"coeff": 1, "terms": {"tuple":'
            ' [{"tuple": ["batch", 99]}]}}}',
            r"power 99 of 'batch' is above 64",
        ),
        ('"batch"', '"no good"', r"symbolic dim name must be an identifier, got 'no good'"),
        ('["batch", 1, 8]', '["batch", 9, 8]', r"symbolic dim 'batch': max 8 < min 9"),
        ('["batch", 1, 8]', '["batch", -3, 8]', r"min must be an int >= 0, got -3"),
        # attribute types are checked against the op's dataclass fields
        ('"eps": {"float": "0x1.4f8b588e368f1p-17"}', '"eps": "x"', r"LayerNorm.eps must be float"),
        ('"has_beta": false', '"has_beta": 0', r"LayerNorm.has_beta must be bool, got int 0"),
        ('"axis": 1', '"axis": true', r"Softmax.axis must be int, got bool True"),
        ('"to": {"dtype": "f32"}', '"to": "f32"', r"Cast.to must be DType, got str 'f32'"),
        (
            '"fn": {"enum": "BinaryKind", "member": "ADD"}',
            '"fn": {"enum": "UnaryKind", "member": "EXP"}',
            r"Binary.fn must be BinaryKind, got UnaryKind",
        ),
        # a constant through the generic dataclass tag skipped the blob-size check
        (
            '{"const": 1, "dims": [4], "dtype": "f32"}',
            '{"dataclass": "ConstValue", "fields": {"data": "abc", "dims": {"tuple": [4000]},'
            ' "dtype": {"enum": "DType", "member": "F32"}}}',
            r"a constant must be stored as a blob reference",
        ),
        # tags have exact key sets
        ('{"dtype": "f32"}', '{"dtype": "f32", "x": 1}', r"malformed value"),
        ('"dims": [4]', '"dims": [4611686018427387904]', r"malformed dim 4611686018427387904"),
    ],
)
def test_crafted_values_are_refused_at_load_naming_node_op_and_attribute(old, new, message):
    text = json.dumps(_frame(dumps(_graph(), locations=False))[0])
    assert old in text, old  # the edit applies to what the writer produces
    with pytest.raises(SerializationError, match=message) as info:
        loads(_crafted(lambda t: t.replace(old, new)))
    assert "graph node %" in str(info.value) or "graph:" in str(info.value)
    assert info.value.__cause__ is None  # refused by a check, not by the catch-all


def test_deep_nesting_is_refused_by_a_check():
    def nest(t: str) -> str:
        deep = '{"tuple": [' * 200 + "1" + "]}" * 200
        return t.replace('"eps": {"float": "0x1.4f8b588e368f1p-17"}', f'"eps": {deep}')

    with pytest.raises(SerializationError, match="nested more than 64 deep") as info:
        loads(_crafted(nest))
    assert info.value.__cause__ is None


def test_loads_takes_bytes_and_names_what_it_got():
    with pytest.raises(SerializationError, match="loads takes bytes, got str"):
        loads("RLXG")
    data = dumps(_graph())
    assert loads(bytearray(data))[0] == loads(memoryview(data))[0] == _graph()


def test_a_pipe_is_read_to_its_end(tmp_path):
    """No size to check before reading: the bytes are read, then framed as from memory."""
    import os
    import threading

    fifo = tmp_path / "graph.fifo"
    os.mkfifo(fifo)
    data = dumps(_graph())
    writer = threading.Thread(target=lambda: fifo.write_bytes(data))
    writer.start()
    try:
        g, _ = load(fifo)
    finally:
        writer.join()
    assert g == _graph()
