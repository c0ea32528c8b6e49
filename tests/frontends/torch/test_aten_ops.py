"""The ATen table op by op: small modules, each exported and run through rlx, against
PyTorch (the oracle). Cases cover each converter family (elementwise with torch's scalar
promotion, reductions, layout, indexing, factories, norms, attention, conv / pooling
variants), several with a symbolic batch dim. Tolerance: rtol 1e-5, atol 1e-5 (f32),
exact for integer and bool results."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.export import Dim

import rlx

R = torch.randn
B = Dim("batch", min=1, max=32)


def _ri(*s: int) -> torch.Tensor:
    return torch.randint(-5, 6, s)


# id -> (function, example inputs, how many leading inputs get a dynamic batch dim)
CASES: dict[str, tuple[Callable, Callable[[], tuple], int]] = {
    "add_alpha_scalar": (lambda x, y: torch.add(x, y, alpha=2) + 1.5, lambda: (R(3, 4), R(4)), 0),
    "int_plus_float_scalar": (lambda x: x + 0.5, lambda: (_ri(3, 4),), 0),
    "int_true_div": (lambda x, y: x / y, lambda: (_ri(3, 4), _ri(3, 4).abs() + 1), 0),
    "floor_div_int": (
        lambda x, y: torch.div(x, y, rounding_mode="floor"),
        lambda: (_ri(4, 5), _ri(4, 5).abs() + 1),
        0,
    ),  # fmt: skip
    "trunc_div_float": (
        lambda x, y: torch.div(x, y, rounding_mode="trunc"),
        lambda: (R(4, 5), R(4, 5)),
        0,
    ),
    "remainder": (lambda x, y: torch.remainder(x, y), lambda: (_ri(4, 5), _ri(4, 5).abs() + 1), 0),
    "rsub_pow": (lambda x: 1 - x**2, lambda: (R(6),), 0),
    "compare_where": (lambda x, y: torch.where(x > y, x, 0.0), lambda: (R(3, 4), R(3, 4)), 9),
    "masked_fill": (lambda x: x.masked_fill(x < 0, -1.0), lambda: (R(3, 4),), 9),
    "logic": (lambda x, y: ((x > 0) & (y > 0)) | ~(x > y), lambda: (R(5), R(5)), 0),
    "unary": (
        lambda x: (
            torch.sigmoid(x) + torch.exp(-x.abs()) + torch.sin(x) * torch.cos(x) + torch.erf(x)
        ),
        lambda: (R(4, 4),),
        9,
    ),  # fmt: skip
    "sqrt_rsqrt_log": (
        lambda x: torch.sqrt(x) + torch.rsqrt(x) + torch.log(x) + torch.log1p(x),
        lambda: (R(4, 4).abs() + 0.1,),
        0,
    ),  # fmt: skip
    "activations": (
        lambda x: (
            F.silu(x)
            + F.gelu(x, approximate="tanh")
            + F.leaky_relu(x, 0.1)
            + F.hardswish(x)
            + F.elu(x)
            + F.softplus(x)
            + F.relu6(x)
        ),
        lambda: (R(3, 7) * 4,),
        9,
    ),  # fmt: skip
    "clamp": (lambda x: torch.clamp(x, -0.5, 0.5) + x.clamp(min=0.1), lambda: (R(3, 4),), 0),
    "reduce": (lambda x: x.sum(-1) + x.mean(1) + x.amax(1) - x.amin(-1), lambda: (R(3, 5),), 9),
    "reduce_keepdim_all": (
        lambda x: x - x.mean(dim=(1, 2), keepdim=True) + x.sum(),
        lambda: (R(2, 3, 4),),
        0,
    ),
    "var_std": (lambda x: x.var(dim=-1) + x.std(dim=-1, unbiased=False), lambda: (R(3, 6),), 9),
    "max_dim_argmax": (lambda x: x.max(dim=1).values + x.argmax(dim=1), lambda: (R(3, 6),), 9),
    "softmax_log_softmax": (
        lambda x: F.softmax(x, -1) + F.log_softmax(x, 0),
        lambda: (R(4, 5),),
        0,
    ),
    "cumsum_cumprod": (lambda x: x.cumsum(1) + x.cumprod(-1), lambda: (R(3, 4),), 9),
    "view_permute_transpose": (
        lambda x: x.view(x.shape[0], 2, 6).permute(2, 0, 1).transpose(0, 1).reshape(x.shape[0], -1),
        lambda: (R(3, 12),),
        9,
    ),  # fmt: skip
    "squeeze_unsqueeze_flatten": (
        lambda x: x.unsqueeze(1).squeeze(1).flatten(1).unsqueeze(-1),
        lambda: (R(2, 3, 4),),
        9,
    ),  # fmt: skip
    "expand_repeat": (
        lambda x: x.expand(3, -1, -1).sum(0) + x.repeat(1, 2)[:, :4],
        lambda: (R(2, 4),),
        0,
    ),
    "slice_select_narrow": (
        lambda x: (
            x[:, 1:5:2] * x[:, -1:].squeeze(1)[:, None]
            + x.narrow(1, 2, 2).sum(1, True)
            + x.select(1, 0)[:, None]
        ),
        lambda: (R(3, 6),),
        9,
    ),  # fmt: skip
    "cat_stack_split": (
        lambda x, y: torch.cat([x, y], 1).split(3, 1)[1] + torch.stack([x, y], 0).sum(0)[:, :3],
        lambda: (R(2, 4), R(2, 4)),
        9,
    ),  # fmt: skip
    "chunk_unbind": (lambda x: x.chunk(2, -1)[0] + x.unbind(1)[1][:, None], lambda: (R(3, 4),), 0),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), lambda: (R(2, 3, 4),), 0),
    "embedding_index_select_gather": (
        lambda w, i: (
            F.embedding(i, w).sum(1)
            + w.index_select(0, i[0])[:1].sum(0)
            + torch.gather(w, 1, i[:, :2] % 4).sum(1, keepdim=True)
        ),
        lambda: (R(10, 4), torch.randint(0, 10, (2, 3))),
        0,
    ),  # fmt: skip
    "index_tensor": (
        lambda x, i, j: x[i] + x[i, j][:, None] + x[:, j].T,
        lambda: (R(5, 5), torch.tensor([0, 4, 2]), torch.tensor([1, 1, 3])),
        0,
    ),  # fmt: skip
    "factories": (
        lambda x: (
            x
            + torch.ones_like(x)
            + torch.zeros(x.shape[1])
            + torch.full_like(x, 2.0)
            + torch.arange(x.shape[1])
            + torch.arange(x.shape[0])[:, None]
        ),
        lambda: (R(3, 4),),
        9,
    ),  # fmt: skip
    "matmul_family": (
        lambda a, b: a @ b + torch.bmm(a, b) + torch.baddbmm(a @ b, a, b, beta=0.5, alpha=2),
        lambda: (R(2, 3, 4), R(2, 4, 3)),
        0,
    ),  # fmt: skip
    "addmm_mm": (
        lambda x, w, b: torch.addmm(b, x, w) + torch.mm(x, w),
        lambda: (R(3, 4), R(4, 5), R(5)),
        0,
    ),
    "layer_norm_2d_shape": (
        lambda x, w: F.layer_norm(x, (3, 4), w, None, 1e-5),
        lambda: (R(2, 3, 4), R(3, 4)),
        1,
    ),
    "rms_norm": (
        lambda x, w: F.rms_norm(x, (8,), w, 1e-6) + F.rms_norm(x, (8,)),
        lambda: (R(2, 3, 8), R(8)),
        1,
    ),
    "group_norm": (
        lambda x: F.group_norm(x, 2, torch.ones(4) * 2, torch.zeros(4) + 0.5),
        lambda: (R(2, 4, 3, 3),),
        9,
    ),
    "sdpa_causal": (
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        lambda: (R(2, 2, 5, 8), R(2, 2, 5, 8), R(2, 2, 5, 8)),
        9,
    ),  # fmt: skip
    "sdpa_gqa_float_mask_scale": (
        lambda q, k, v, m: F.scaled_dot_product_attention(
            q, k, v, attn_mask=m, scale=0.3, enable_gqa=True
        ),
        lambda: (R(2, 4, 5, 8), R(2, 2, 6, 8), R(2, 2, 6, 8), R(2, 1, 5, 6)),
        0,
    ),  # fmt: skip
    "sdpa_bool_mask": (
        lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
        lambda: (
            R(1, 2, 4, 8),
            R(1, 2, 4, 8),
            R(1, 2, 4, 8),
            torch.tensor([True, True, False, True]).expand(4, 4),
        ),
        0,
    ),  # fmt: skip
    "conv_groups_dilation": (
        lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=2, dilation=2, groups=2),
        lambda: (R(2, 4, 9, 9), R(6, 2, 3, 3)),
        1,
    ),  # fmt: skip
    "conv1d_same": (
        lambda x, w, b: F.conv1d(x, w, b, padding="same"),
        lambda: (R(2, 3, 10), R(5, 3, 4), R(5)),
        1,
    ),
    "pools": (
        lambda x: (
            F.max_pool2d(x, 3, 2, 1)
            + F.avg_pool2d(x, 3, 2, 1)
            + F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
        ),
        lambda: (R(2, 3, 8, 8),),
        9,
    ),  # fmt: skip
    "pool1d_adaptive": (
        lambda x: F.max_pool1d(x, 2) + F.adaptive_avg_pool1d(x, 4) + F.avg_pool1d(x, 2),
        lambda: (R(2, 3, 8),),
        9,
    ),  # fmt: skip
    "adaptive_avg_pool2d": (
        lambda x: F.adaptive_avg_pool2d(x, (2, 3)),
        lambda: (R(2, 3, 4, 6),),
        9,
    ),
}


class _Fn(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return self.fn(*xs)


@pytest.mark.parametrize("case", sorted(CASES))
def test_aten_op_matches_torch(case: str):
    fn, make, n_dyn = CASES[case]
    torch.manual_seed(sum(map(ord, case)))
    args = make()
    dynamic = [i < n_dyn for i in range(len(args))]
    ds = (tuple({0: B} if d else None for d in dynamic),) if n_dyn else None  # forward(*xs)
    tm = rlx.from_torch(_Fn(fn), args, ds)
    cg = tm.compile()
    runs = [args]
    if n_dyn:  # a second batch size on the same compiled graph
        runs.append(tuple(torch.cat([a, a[:1]], 0) if d else a for a, d in zip(args, dynamic)))
    for xs in runs:
        got = cg.run(dict(zip(tm.inputs, [x.numpy() for x in xs], strict=True)))[0]
        want = fn(*xs).numpy()
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype.kind in "biu":
            np.testing.assert_array_equal(got, want)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
