"""What packed bytes mean: the ``QuantScheme`` layouts (``schemes.py``: Int8/Int4 blocks,
FP8, the GGUF block types) and the GGUF block decoders (``gguf.py``). Imports only the
foundation (dtype, errors), so ops, kernels, quantization and the GGUF reader all use it."""
