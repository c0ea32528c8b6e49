"""Which differential fuzz test checks each registered op, and against which independent
oracle. ``tests/ops/test_registry.py`` asserts that the keys are exactly the built-in ops
of the registry (an op added without an entry fails there) and that every test named here
exists.

``COVERAGE[mnemonic] = (oracle, tests)``: ``tests`` are ``file::function`` under
tests/fuzz/. Every per-op test (``test_ops_*.py``, see harness.py) runs rlx's reference
interpreter and the compiled CPU graph under every precision policy and every native
target against the oracle; ``test_differential.py`` draws random graphs of several ops
(oracle.py, a float64 NumPy interpreter).
"""

from __future__ import annotations

__all__ = ["COVERAGE", "DIFFERENTIAL"]

DIFFERENTIAL = "test_differential.py::test_compiled_and_reference_match_the_oracle"
_BITS = "test_ops_bits.py::"
_ELEM = "test_ops_elementwise.py::"
_GRAD = "test_ops_grad.py::"
_IDX = "test_ops_indexing.py::"
_LIN = "test_ops_linalg.py::"
_MISC = "test_ops_misc.py::"
_NN = "test_ops_nn.py::"
_PACK = "test_ops_packed.py::"
_QUANT = "test_ops_quant.py::"
_LSP = "test_ops_loss_spatial.py::"
_BWD = "test_ops_grad_ops.py::"
_MOE = "test_ops_moe.py::"

_STATE = _MISC + "test_assign_barrier_stop_gradient_constant_over_runs"
_LEAVES = _MISC + "test_constants_inputs_and_params_come_out_unchanged"
_MOVE = _IDX + "test_movement_ops_match_onnx"
_TOPK = _IDX + "test_topk_argmax_argmin_match_onnx"
_CUM = _IDX + "test_cumsum_matches_onnx_and_cumprod_a_loop"
_NORMS = _NN + "test_norms_match_torch"
# ops a graph with a symbolic dim runs at several sizes (tests/fuzz/test_ops_symbolic.py)
_SYMBOLIC = "test_ops_symbolic.py::test_symbolic_dims_one_graph_every_size"
_ON_SYMBOLIC = ("unary", "binary", "softmax", "log_softmax", "layer_norm", "matmul", "attention",
                "rope", "gather", "concat", "cumsum", "reduce", "conv")  # fmt: skip
_SOFTMAX = _NN + "test_softmax_and_log_softmax_match_torch"

COVERAGE: dict[str, tuple[str, tuple[str, ...]]] = {
    # ---- elementwise, reductions, casts
    "unary": ("math functions, Python ints", (_ELEM + "test_unary_kinds_match_math", DIFFERENTIAL)),
    "binary": ("Python float / int arithmetic", (_ELEM + "test_binary_kinds_match_python", DIFFERENTIAL)),
    "compare": ("Python comparisons", (_ELEM + "test_compare_and_where_match_python", DIFFERENTIAL)),
    "where": ("Python selection", (_ELEM + "test_compare_and_where_match_python", DIFFERENTIAL)),
    "cast": ("exact round-to-nearest-even (fractions.Fraction), int truncation", (_ELEM + "test_cast_matches_exact_rounding", DIFFERENTIAL)),
    "reduce": ("Python loops over the reduced axes", (_ELEM + "test_reduce_kinds_match_loops", DIFFERENTIAL)),
    "trig": ("math functions", (_BITS + "test_trig_matches_math",)),
    "bitwise": ("Python ints wrapped to the dtype", (_BITS + "test_bitwise_matches_python_ints",)),
    "bitwise_not": ("Python ints wrapped to the dtype", (_BITS + "test_bitwise_matches_python_ints",)),
    "bitcast": ("struct.pack / struct.unpack", (_BITS + "test_bitcast_matches_struct",)),
    "elementwise_region": ("the body's functions in float64", (_MISC + "test_elementwise_region_matches_its_body", DIFFERENTIAL)),
    # ---- movement and indexing
    "shape_of": ("the dims of the arrays fed", (_BITS + "test_shape_of_reads_symbolic_dims_at_run_time",)),
    "reshape": ("onnx.reference Reshape", (_MOVE, DIFFERENTIAL)),
    "transpose": ("onnx.reference Transpose", (_MOVE, DIFFERENTIAL)),
    "concat": ("onnx.reference Concat", (_MOVE, DIFFERENTIAL)),
    "narrow": ("onnx.reference Slice", (_MOVE, DIFFERENTIAL)),
    "slice": ("onnx.reference Slice", (_MOVE,)),
    "pad": ("onnx.reference Pad", (_MOVE,)),
    "expand": ("onnx.reference Expand", (_MOVE,)),
    "gather": ("onnx.reference Gather", (_IDX + "test_gather_matches_onnx_and_scatter_add_matches_index_add",)),
    "scatter_add": ("torch.Tensor.index_add", (_IDX + "test_gather_matches_onnx_and_scatter_add_matches_index_add",)),
    "gather_elements": ("torch.gather", (_IDX + "test_gather_and_scatter_elements_match_onnx",)),
    "scatter_elements": ("onnx.reference ScatterElements", (_IDX + "test_gather_and_scatter_elements_match_onnx",)),
    "gather_nd": ("onnx.reference GatherND", (_IDX + "test_gather_and_scatter_nd_match_onnx",)),
    "scatter_nd": ("onnx.reference ScatterND", (_IDX + "test_gather_and_scatter_nd_match_onnx",)),
    "topk": ("onnx.reference TopK", (_TOPK,)),
    "argmax": ("onnx.reference ArgMax", (_TOPK,)),
    "argmin": ("onnx.reference ArgMin", (_TOPK,)),
    "cumsum": ("onnx.reference CumSum", (_CUM,)),
    "cumprod": ("a Python loop", (_CUM,)),
    # ---- neural-network forward ops and fused ops
    "softmax": ("torch.softmax (float64)", (_SOFTMAX, DIFFERENTIAL)),
    "log_softmax": ("torch.log_softmax (float64)", (_SOFTMAX, DIFFERENTIAL)),
    "layer_norm": ("torch F.layer_norm", (_NORMS, DIFFERENTIAL)),
    "rms_norm": ("torch F.rms_norm", (_NORMS, DIFFERENTIAL)),
    "fused_residual_layer_norm": ("torch F.layer_norm of x + residual", (_NORMS,)),
    "fused_residual_rms_norm": ("torch F.rms_norm of x + residual", (_NORMS,)),
    "group_norm": ("torch F.group_norm", (_NN + "test_group_norm_matches_torch",)),
    "attention": ("torch, float64 (torch_oracles.attention)", (_NN + "test_attention_matches_torch", DIFFERENTIAL)),
    "conv": ("torch F.conv1d / F.conv2d", (_NN + "test_conv_matches_torch",)),
    "pool": ("torch F.max_pool / F.avg_pool", (_NN + "test_pool_matches_torch",)),
    "rope": ("torch, float64 (torch_oracles.rope)", (_NN + "test_rope_matches_torch",)),
    "rope_norm": ("torch F.rms_norm + torch_oracles.rope, float64", ("test_ops_decoder.py::test_rope_norm_matches_torch",)),
    "norm_add": ("torch F.rms_norm + residual, float64", ("test_ops_decoder.py::test_norm_add_matches_torch",)),
    "fused_matmul_bias_act": ("torch matmul + activation", (_NN + "test_fused_matmul_ops_match_torch",)),
    "fused_swiglu": ("torch F.silu(x @ wg) * (x @ wu)", (_NN + "test_fused_matmul_ops_match_torch",)),
    # ---- derivative ops
    "layer_norm_backward": ("torch.autograd of F.layer_norm", (_GRAD + "test_norm_backward_matches_autograd",)),
    "rms_norm_backward": ("torch.autograd of F.rms_norm", (_GRAD + "test_norm_backward_matches_autograd",)),
    "softmax_backward": ("torch _softmax_backward_data", (_GRAD + "test_softmax_backward_matches_torch",)),
    "log_softmax_backward": ("torch _log_softmax_backward_data", (_GRAD + "test_softmax_backward_matches_torch",)),
    "attention_backward": ("torch.autograd", (_GRAD + "test_attention_backward_matches_autograd",)),
    "attention_jvp": ("torch.func.jvp", (_GRAD + "test_attention_jvp_matches_torch_func_jvp",)),
    "rope_backward": ("torch.autograd", (_GRAD + "test_rope_backward_matches_autograd",)),
    "conv_backward_data": ("torch.autograd of F.conv", (_GRAD + "test_conv_backward_matches_autograd",)),
    "conv_backward_weight": ("torch.autograd of F.conv", (_GRAD + "test_conv_backward_matches_autograd",)),
    "pool_backward": ("torch.autograd of F.max_pool / avg pool", (_GRAD + "test_pool_backward_and_max_pool_select_match_torch",)),
    "max_pool_select": ("torch.func.jvp of F.max_pool", (_GRAD + "test_pool_backward_and_max_pool_select_match_torch",)),
    "gather_backward": ("torch.autograd of index_select", (_GRAD + "test_gather_backward_matches_index_select_grad",)),
    # ---- backward ops autodiff emits instead of primitive graphs (the seed's *Backward*)
    "relu_backward": ("torch aten.threshold_backward", (_BWD + "test_relu_and_activation_backward_match_torch",)),
    "activation_backward": ("torch aten.{gelu,silu,tanh,sigmoid,softplus,hardswish}_backward", (_BWD + "test_relu_and_activation_backward_match_torch",)),
    "layer_norm_backward_gamma": ("torch.autograd of F.layer_norm (weight)", (_BWD + "test_layer_norm_backward_gamma_matches_autograd",)),
    "max_pool2d_backward": ("torch.autograd of F.max_pool2d", (_BWD + "test_max_pool2d_backward_matches_torch",)),
    "fake_quantize_backward": ("torch.autograd of torch.fake_quantize_per_{tensor,channel}_affine", (_BWD + "test_fake_quantize_backward_matches_autograd",)),
    "fake_quantize_lsq_backward_x": ("torch.autograd of torch._fake_quantize_learnable_*", (_BWD + "test_fake_quantize_lsq_backward_matches_autograd",)),
    "fake_quantize_lsq_backward_scale": ("torch.autograd of torch._fake_quantize_learnable_*", (_BWD + "test_fake_quantize_lsq_backward_matches_autograd",)),
    "scan_backward": ("torch.autograd of the RNN step in PyTorch, stepped in reverse", (_BWD + "test_scan_backward_matches_autograd",)),
    "scan_backward_xs": ("torch.autograd of the RNN step in PyTorch, stepped in reverse", (_BWD + "test_scan_backward_matches_autograd",)),
    # ---- linear algebra, recurrences, KV cache, FFT
    "matmul": ("explicit index loops", (_LIN + "test_dot_general_and_matmul_match_loops", DIFFERENTIAL)),
    "dot_general": ("explicit index loops", (_LIN + "test_dot_general_and_matmul_match_loops",)),
    "lora_matmul": ("explicit loops", (_LIN + "test_lora_and_grouped_matmul_match_loops",)),
    "grouped_matmul": ("a per-row expert loop", (_LIN + "test_lora_and_grouped_matmul_match_loops",)),
    "dense_solve": ("scipy.linalg.solve", (_LIN + "test_dense_solves_match_scipy",)),
    "batched_dense_solve": ("scipy.linalg.solve per system", (_LIN + "test_dense_solves_match_scipy",)),
    "selective_scan": ("per-(batch, channel, step) loops", (_LIN + "test_selective_scan_matches_loops",)),
    "gated_delta_net": ("per-(batch, head, step) loops", (_LIN + "test_gated_delta_net_matches_loops",)),
    "cache_attention": ("loops over a cache state kept by the test", (_LIN + "test_cache_attention_steps_match_loops",)),
    "slot_cache_attention": ("per-token loops over slot caches kept by the test", (_LIN + "test_slot_cache_attention_matches_loops",)),
    "fft": ("explicit DFT sums", (_LIN + "test_fft_matches_dft_sums",)),
    # ---- quantized and packed weights
    "qmatmul": ("int64 NumPy accumulator, f32 rescale", (_QUANT + "test_qmatmul_matches_int64",)),
    "dynamic_qmatmul": ("int64 NumPy, per-row quantization step by step", (_QUANT + "test_dynamic_qmatmul_matches_int64",)),
    "dynamic_qbatch_matmul": ("int64 NumPy, per-row quantization step by step", (_QUANT + "test_dynamic_qbatch_matmul_matches_int64",)),
    "qconv2d": ("int64 loops over the kernel taps", (_QUANT + "test_qconv2d_matches_int64_loops",)),
    # ---- blocked (NCHWc) activations of the layout pass
    "to_nchwc": ("NumPy index arithmetic (channel c at block c // b, lane c % b)", ("test_ops_layout.py::test_nchwc_reorders_match_index_arithmetic",)),
    "from_nchwc": ("NumPy index arithmetic (channel c at block c // b, lane c % b)", ("test_ops_layout.py::test_nchwc_reorders_match_index_arithmetic",)),
    "conv_nchwc": ("torch F.conv2d (float64)", ("test_ops_layout.py::test_conv_nchwc_matches_torch",)),
    "dequant_matmul": ("element-wise decoding / gguf.quants, float64 product", (_PACK + "test_dequant_matmul_matches_decoded_f64",)),
    "dequant_gather": ("gguf.quants.dequantize (Q8_K: d * q)", (_PACK + "test_dequant_gather_matches_gguf_decoding",)),
    "quantize": ("Python round (half to even) and ints", (_PACK + "test_quantize_and_dequantize_match_python_ints",)),
    "dequantize": ("Python ints times the f32 scale", (_PACK + "test_quantize_and_dequantize_match_python_ints",)),
    "fake_quantize": ("Python round (half to even) and ints", (_PACK + "test_fake_quantizers_match_python_rounding",)),
    "fake_quantize_lsq": ("Python round (half to even) and ints", (_PACK + "test_fake_quantizers_match_python_rounding",)),
    # ---- mixture of experts (GGUF-packed expert stacks) and fused transformer blocks
    "dequant_grouped_matmul": ("gguf.quants.dequantize per expert, float64 per-row product", (_MOE + "test_dequant_grouped_matmul_matches_gguf_decoding",)),
    "fused_attention_block": ("torch nn.MultiheadAttention (float64)", ("test_ops_blocks.py::test_fused_attention_block_matches_torch",)),
    "fused_transformer_layer": ("torch nn.TransformerEncoderLayer (float64)", ("test_ops_blocks.py::test_fused_transformer_layer_matches_torch",)),
    "dequant_moe_weights": ("gguf.quants.dequantize per expert, transposed", (_MOE + "test_dequant_moe_weights_matches_gguf_decoding",)),
    # ---- sampling, state, control flow, custom ops, leaves
    "sample": ("the documented contract over a Philox4x32-10 checked against Random123's known answers", (_MISC + "test_sample_matches_the_contract",)),
    "assign": ("an explicit state machine over runs", (_STATE,)),
    "barrier": ("the identity", (_STATE,)),
    "stop_gradient": ("the identity", (_STATE,)),
    "adam_update": ("torch.optim.Adam / AdamW (float64)", (_MISC + "test_adam_update_matches_torch_optim",)),
    "if": ("Python if over the branch functions", (_MISC + "test_if_and_while_match_python_loops",)),
    "while": ("a Python loop", (_MISC + "test_if_and_while_match_python_loops",)),
    "scan": ("a Python loop", (_MISC + "test_scan_matches_a_python_loop",)),
    "custom": ("the user's function in float64", (_MISC + "test_custom_and_custom_fn_match_their_functions",)),
    "custom_fn": ("the body's function in float64", (_MISC + "test_custom_and_custom_fn_match_their_functions",)),
    "constant": ("the array itself", (_LEAVES, _STATE, DIFFERENTIAL)),
    "input": ("the array itself", (_LEAVES, DIFFERENTIAL)),
    "param": ("the array itself", (_LEAVES, DIFFERENTIAL)),
    # ---- losses, complex values, 2-D spatial movement (test_ops_loss_spatial.py)
    "softmax_cross_entropy": ("torch F.cross_entropy, reduction none (float64)", (_LSP + "test_softmax_cross_entropy_matches_torch",)),
    "softmax_cross_entropy_backward": ("torch.autograd of F.cross_entropy (float64)", (_LSP + "test_softmax_cross_entropy_matches_torch",)),
    "conjugate": ("torch.conj (complex128)", (_LSP + "test_complex_ops_match_torch",)),
    "complex_norm_sq": ("torch z.abs() ** 2 (complex128)", (_LSP + "test_complex_ops_match_torch",)),
    "complex_norm_sq_backward": ("torch.autograd of z.abs() ** 2 (complex128)", (_LSP + "test_complex_ops_match_torch",)),
    "resize_nearest_2x": ("torch F.interpolate, nearest, scale 2", (_LSP + "test_resize_nearest_2x_matches_interpolate",)),
    "axial_rope_2d": ("torch.polar rotations written in the test (float64)", (_LSP + "test_axial_rope_2d_matches_torch",)),
}  # fmt: skip
for _op in _ON_SYMBOLIC:
    COVERAGE[_op] = (COVERAGE[_op][0], (*COVERAGE[_op][1], _SYMBOLIC))
