"""The op registry. Importing this package registers every built-in op.

Each module holds a family of ops, one registered class per op (see ``base.py``)."""

import importlib

from rlx.ops.base import OPS, Op, OpKind, RefCtx, register

# one module per op family; each registers its ops (and Graph builder methods) on import
_MODULES = (
    "core",  # input, param, constant
    "elementwise",  # unary, binary, compare, where, cast
    "reduce",  # reduce, softmax, cumsum, topk, argmax
    "norm",  # layer_norm, rms_norm, group_norm
    "movement",  # reshape, transpose, concat, expand, narrow, gather, scatter_add, ...
    "linalg",  # matmul, dot_general, dense_solve, grouped_matmul, lora_matmul
    "nn",  # attention (MaskKind), rope, conv, pool
    "nn_grad",  # *_backward ops of the norms, attention, rope, conv, pool; attention_jvp
    "fft",  # fft, rfft, irfft
    "fft_ops",  # builders over primitive ops: stft, psd_real, fft_conv1d, fftfreq
    "quant",  # quantize, dequantize, fake_quantize, dequant_matmul, qmatmul
    "fake_quant",  # fake_quantize_lsq (scale as an input), straight-through rules
    "fused",  # fused_matmul_bias_act, fused_swiglu, fused_residual_*, elementwise_region
    "control",  # if, while, scan
    "recurrent",  # gated_delta_net (HIR block support), selective_scan
    "qconv",  # qconv2d (integer conv, f32 epilogue)
    "sample",  # sample (temperature / top-k / top-p token sampling, Philox stream)
    "custom",  # user-registered custom ops, custom_fn (a sub-graph as one op)
    "indexing",  # gather_elements, scatter_elements, gather_nd, scatter_nd
    "bitwise",  # bitwise and / or / xor / shifts, bitwise_not
    "trig",  # tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh
    "cumulative",  # cumprod
    "reduce_grad",  # softmax_backward, log_softmax_backward
    "bitcast",  # bitcast (the same bytes as another dtype)
    "kvcache",  # cache_attention (attention through a KV cache), dequant_gather
    "grad_util",  # gather_backward (and the movement / linalg rules' helpers)
    "state",  # assign (writes a param when the compiled graph runs), barrier
)
for _m in _MODULES:
    importlib.import_module(f"rlx.ops.{_m}")

__all__ = ["OPS", "Op", "OpKind", "RefCtx", "register"]
