"""GGUF block layouts for tests, stated from the ggml block structs (not from rlx). In: a
layout name and raw block bytes. Out: the byte offsets of its f16 scale fields
(:data:`F16_FIELDS`) and blocks whose scales are small finite f16 (:func:`set_f16_scales`)."""

from __future__ import annotations

import numpy as np

#: byte offsets of the f16 scale fields of each block layout
F16_FIELDS: dict[str, tuple[int, ...]] = {
    "Q4_0": (0,),
    "Q4_1": (0, 2),
    "Q5_0": (0,),
    "Q5_1": (0, 2),
    "Q8_0": (0,),
    "Q2_K": (80, 82),
    "Q3_K": (108,),
    "Q4_K": (0, 2),
    "Q5_K": (0, 2),
    "Q6_K": (208,),
}


def set_f16_scales(blocks: np.ndarray, name: str, rng: np.random.Generator) -> None:
    """Overwrite (in place) the f16 scale fields of ``blocks`` ([n_blocks, block_bytes]
    uint8, layout ``name``) with values drawn from U(0.001, 0.05); layouts without f16
    fields are left as they are."""
    for off in F16_FIELDS.get(name, ()):
        blocks[:, off : off + 2] = (
            rng.uniform(0.001, 0.05, len(blocks)).astype("<f2").view(np.uint8).reshape(-1, 2)
        )
