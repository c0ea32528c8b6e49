"""The op registry. Importing this package registers every built-in op.

Each module holds a family of ops, one registered class per op (see ``base.py``);
``compose/`` holds builders over existing ops (no class, no kernel) and ``rules.py`` the
helpers the ops' derivative and batching rules share."""

from rlx.ops.base import OPS, Op, OpKind, RefCtx, register

# One module per op family; each registers its ops (and Graph builder methods) on import,
# in this order (the registry's order), so the imports are kept out of isort's hands.
# isort: off
from rlx.ops import core  # input, param, constant
from rlx.ops import elementwise  # unary, binary, compare, where, cast
from rlx.ops import reduce  # reduce, softmax, cumsum, topk, argmax
from rlx.ops import norm  # layer_norm, rms_norm, group_norm
from rlx.ops import movement  # reshape, transpose, concat, expand, narrow, gather, ...
from rlx.ops import linalg  # matmul, dot_general, dense_solve, grouped_matmul, lora_matmul
from rlx.ops import nn  # attention (MaskKind), rope, conv, pool
from rlx.ops import nn_grad  # *_backward ops of norms, attention, rope, conv, pool; attention_jvp
from rlx.ops import fft  # fft, rfft, irfft
from rlx.ops.compose import fft as compose_fft  # builders: stft, psd_real, fft_conv1d, fftfreq
from rlx.ops import quant  # quantize, dequantize, fake_quantize, dequant_matmul, qmatmul
from rlx.ops import fake_quant  # fake_quantize_lsq (scale as an input), straight-through rules
from rlx.ops import fused  # fused_matmul_bias_act, fused_swiglu, fused_residual_*, regions
from rlx.ops import control  # if, while, scan
from rlx.ops import recurrent  # gated_delta_net (HIR block support), selective_scan
from rlx.ops import qconv  # qconv2d (integer conv, f32 epilogue)
from rlx.ops import sample  # sample (temperature / top-k / top-p token sampling, Philox)
from rlx.ops import custom  # user-registered custom ops, custom_fn (a sub-graph as one op)
from rlx.ops import indexing  # gather_elements, scatter_elements, gather_nd, scatter_nd
from rlx.ops import bitwise  # bitwise and / or / xor / shifts, bitwise_not
from rlx.ops import trig  # tan, asin, acos, atan, sinh, cosh, asinh, acosh, atanh
from rlx.ops import cumulative  # cumprod
from rlx.ops import reduce_grad  # softmax_backward, log_softmax_backward
from rlx.ops import bitcast  # bitcast (the same bytes as another dtype)
from rlx.ops import kvcache  # cache_attention (attention through a KV cache), dequant_gather
from rlx.ops import grad_util  # gather_backward (and the movement / linalg rules' helpers)
from rlx.ops import state  # assign (writes a param when the compiled graph runs), barrier
from rlx.ops import loss  # softmax_cross_entropy and its backward op
from rlx.ops import complex  # conjugate, complex_norm_sq and its backward op
from rlx.ops import spatial  # resize_nearest_2x, axial_rope_2d
from rlx.ops import activation_grad  # relu_backward, activation_backward
from rlx.ops import control_grad  # scan_backward, scan_backward_xs
from rlx.ops import moe  # dequant_grouped_matmul, dequant_moe_weights (GGUF expert stacks)
from rlx.ops.compose import moe as compose_moe  # builder: moe_block (router top-k + experts)
from rlx.ops import blocks  # fused_attention_block, fused_transformer_layer
from rlx.ops import decoder  # rope_norm, norm_add (the fused ops of rlx.models.llm)
from rlx.ops import layout  # to_nchwc, from_nchwc, conv_nchwc (blocked activations)
# isort: on

# the modules above, in registration order
FAMILIES = (
    core,
    elementwise,
    reduce,
    norm,
    movement,
    linalg,
    nn,
    nn_grad,
    fft,
    compose_fft,
    quant,
    fake_quant,
    fused,
    control,
    recurrent,
    qconv,
    sample,
    custom,
    indexing,
    bitwise,
    trig,
    cumulative,
    reduce_grad,
    bitcast,
    kvcache,
    grad_util,
    state,
    loss,
    complex,
    spatial,
    activation_grad,
    control_grad,
    moe,
    compose_moe,
    blocks,
    decoder,
    layout,
)

__all__ = ["OPS", "Op", "OpKind", "RefCtx", "register"]
