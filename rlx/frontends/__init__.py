"""Importers of other model formats into rlx graphs, one module or package each
(``rlx.frontends.onnx``: ONNX files; ``rlx.frontends.gguf``: GGUF weights and
tokenizers). They use the IR and the runtime; nothing below them imports a frontend."""
