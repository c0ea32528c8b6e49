"""GGUF (llama.cpp's model file format): ``rlx.gguf.load(path) -> GgufFile`` (metadata and
memory-mapped tensors, each with its rlx QuantScheme, zero-copy packed bytes and exact
f32 decode), ``rlx.gguf.save(path, tensors, scheme=...)`` (quantized with rlx's packers,
written with ``gguf.GGUFWriter``) and ``GgufTokenizer`` (the tokenizer its metadata
describes). Needs the ``gguf`` package (``pip install 'rlx[llm]'``, the llm extra).

``reader.py`` parses the file; ``tensor.py`` maps ggml types to rlx schemes;
``writer.py`` writes; ``tokenizer.py`` (+ ``bpe.py``) encodes and decodes text.
"""

from __future__ import annotations

try:
    import gguf as _gguf  # noqa: F401
except ImportError as _e:  # pragma: no cover - exercised in an environment without gguf
    from rlx.errors import ModelError

    raise ModelError(
        "rlx.gguf needs the 'gguf' package, which is not installed: "
        "pip install 'rlx[llm]' (the llm extra)"
    ) from _e

from rlx.errors import GgufError
from rlx.frontends.gguf.reader import GgufFile, load
from rlx.frontends.gguf.tensor import GgufTensor
from rlx.frontends.gguf.tokenizer import GgufTokenizer, StreamDecoder
from rlx.frontends.gguf.writer import save, save_graph_weights

__all__ = [
    "load",
    "save",
    "save_graph_weights",
    "GgufFile",
    "GgufTensor",
    "GgufError",
    "GgufTokenizer",
    "StreamDecoder",
]
