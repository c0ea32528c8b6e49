"""Random GGUF tensors for the tests: block bytes whose scale fields are finite (offsets
from ggml's block structs), written with ``gguf.GGUFWriter`` directly (not rlx's writer)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

gguf = __import__("pytest").importorskip("gguf")

#: type name -> (elements per block, bytes per block, byte offsets of f16 scale fields)
LAYOUTS = {
    "Q4_0": (32, 18, [0]),
    "Q4_1": (32, 20, [0, 2]),
    "Q5_0": (32, 22, [0]),
    "Q5_1": (32, 24, [0, 2]),
    "Q8_0": (32, 34, [0]),
    "Q2_K": (256, 84, [80, 82]),
    "Q3_K": (256, 110, [108]),
    "Q4_K": (256, 144, [0, 2]),
    "Q5_K": (256, 176, [0, 2]),
    "Q6_K": (256, 210, [208]),
    "Q8_K": (256, 292, []),  # f32 d at 0
}
PLAIN = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8}
PLAIN.update({"I16": np.int16, "I32": np.int32, "I64": np.int64})


def random_blocks(type_name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """u8 [rows, k / qk * block_bytes] of random blocks with moderate finite scales."""
    qk, bb, halves = LAYOUTS[type_name]
    rng = np.random.default_rng(seed)
    nb = rows * k // qk
    b = rng.integers(0, 256, (nb, bb), dtype=np.uint8)
    for at in halves:
        b[:, at : at + 2] = rng.uniform(-0.05, 0.05, nb).astype("<f2").view(np.uint8).reshape(-1, 2)
    if type_name == "Q8_K":
        b[:, 0:4] = rng.uniform(0.001, 0.05, nb).astype("<f4").view(np.uint8).reshape(-1, 4)
    return b.reshape(rows, -1)


def finish(w: gguf.GGUFWriter) -> None:
    """Write the header, metadata and tensors ``w`` holds to its file and close it."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write(path: Path, tensors: dict[str, tuple[str, np.ndarray]], **kv) -> Path:
    """Write ``name -> (type name, array)`` (block and BF16 types as their u8 bytes, rows
    last) and metadata (``a__b=`` for key ``a.b``) with gguf.GGUFWriter."""
    w = gguf.GGUFWriter(str(path), arch=kv.pop("arch", "llama"))
    for key, val in kv.items():
        key = key.replace("__", ".")
        if isinstance(val, str):
            w.add_string(key, val)
        elif isinstance(val, bool):
            w.add_bool(key, val)
        elif isinstance(val, int):
            w.add_uint32(key, val)
        elif isinstance(val, float):
            w.add_float32(key, val)
        else:
            w.add_array(key, val)
    for name, (tname, arr) in tensors.items():
        raw = None if tname in PLAIN else gguf.GGMLQuantizationType[tname]
        w.add_tensor(name, arr, raw_dtype=raw)
    finish(w)
    return path
