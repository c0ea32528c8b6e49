"""Shape rules of the HIR blocks. In: a block and its input shapes. Out: the block's
output Shape, or a ShapeError whose sentence names the offending tensor (the HIR builder
adds the block, node and user line)."""

from __future__ import annotations

from collections.abc import Callable

from rlx.errors import ShapeError
from rlx.ir.hir_blocks import (
    AttentionBlock,
    DepthwiseConv1dCausalBlock,
    DequantMatMulBlock,
    GatedDeltaNetBlock,
    HirBlock,
    LinearBlock,
    LinearFusedBlock,
    MirBlock,
    ResidualRmsNormBlock,
    RmsNormBlock,
    RopeBlock,
    SharedLinearPairBlock,
    SwiGluBlock,
)
from rlx.shape import Shape, broadcast_dims

__all__ = ["infer_block", "is_custom_mask"]

Rule = Callable[[HirBlock, tuple[Shape, ...]], Shape]
_RULES: dict[type[HirBlock], Rule] = {}


def _rule(cls: type[HirBlock]) -> Callable[[Rule], Rule]:
    def deco(fn: Rule) -> Rule:
        _RULES[cls] = fn
        return fn

    return deco


def infer_block(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    """The output shape of ``block`` applied to inputs of shapes ``ins`` (leaves, i.e.
    inputs, params and constants, carry their shape and have no rule)."""
    return _RULES[type(block)](block, ins)


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ShapeError(msg)


def _same_float(names: tuple[str, ...], ins: tuple[Shape, ...]) -> None:
    first = ins[0]
    _need(first.dtype.is_float, f"{names[0]} must be a float tensor, got {first}")
    for nm, s in zip(names[1:], ins[1:], strict=False):
        _need(s.dtype is first.dtype, f"{nm} {s} must have the dtype of {names[0]} {first}")


def _matmul_out(x: Shape, w: Shape, wname: str = "weight") -> tuple:
    _need(x.rank >= 1, f"input x must have rank >= 1, got {x}")
    _need(w.rank == 2, f"{wname} must be [in, out], got {w}")
    _need(
        x.dims[-1] == w.dims[0],
        f"input x {x} has {x.dims[-1]} features but {wname} {w} expects {w.dims[0]}",
    )
    return (*x.dims[:-1], w.dims[1])


@_rule(LinearBlock)
@_rule(LinearFusedBlock)
def _linear(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    x, w = ins[:2]
    _same_float(("x", "weight", "bias"), ins)
    dims = _matmul_out(x, w)
    if len(ins) == 3:
        _need(
            ins[2].dims == (w.dims[1],),
            f"bias must be [{w.dims[1]}] for weight {w}, got {ins[2]}",
        )
    return Shape(dims, x.dtype)


@_rule(SharedLinearPairBlock)
def _pair(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    x, w1, w2 = ins
    _same_float(("x", "w_first", "w_second"), ins)
    d1 = _matmul_out(x, w1, "w_first")
    d2 = _matmul_out(x, w2, "w_second")
    return Shape(d1 if block.slot == 0 else d2, x.dtype)  # type: ignore[attr-defined]


@_rule(SwiGluBlock)
def _swiglu(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    x, up, gate, down = ins
    _same_float(("x", "up_w", "gate_w", "down_w"), ins)
    h_up = _matmul_out(x, up, "up_w")
    h_gate = _matmul_out(x, gate, "gate_w")
    _need(h_up == h_gate, f"up_w {up} and gate_w {gate} must have the same shape")
    return Shape(_matmul_out(Shape(h_up, x.dtype), down, "down_w"), x.dtype)


def _norm_params(x: Shape, params: tuple[Shape, ...], names: tuple[str, ...]) -> None:
    _need(x.rank >= 1, f"x must have rank >= 1, got {x}")
    for nm, p in zip(names, params, strict=False):
        _need(p.dims == (x.dims[-1],), f"{nm} must be [{x.dims[-1]}] for x {x}, got {p}")


@_rule(RmsNormBlock)
def _rms(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    _same_float(("x", "gamma", "beta"), ins)
    _norm_params(ins[0], ins[1:], ("gamma", "beta"))
    return ins[0]


@_rule(ResidualRmsNormBlock)
def _res_rms(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    x, res = ins[:2]
    _same_float(("x", "residual", "gamma", "beta"), ins)
    _need(x.dims == res.dims, f"residual {res} must have the shape of x {x}")
    _norm_params(x, ins[2:], ("gamma", "beta"))
    return x


def is_custom_mask(mask: object) -> bool:
    from rlx.ops.nn import MaskKind

    return mask == MaskKind.custom()


@_rule(AttentionBlock)
def _attention(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    b: AttentionBlock = block  # type: ignore[assignment]
    q, k, v = ins[:3]
    _same_float(("q", "k", "v"), (q, k, v))
    _need(
        b.num_heads > 0 and b.head_dim > 0,
        f"num_heads {b.num_heads} and head_dim {b.head_dim} must be > 0",
    )
    _need(
        b.num_kv_heads > 0 and b.num_heads % b.num_kv_heads == 0,
        f"num_heads {b.num_heads} must be a multiple of num_kv_heads {b.num_kv_heads}",
    )
    _need(q.rank == 3, f"q must be [B, Sq, H*D], got {q}")
    _need(
        q.dims[2] == b.num_heads * b.head_dim,
        f"q {q} last dim must be num_heads*head_dim = {b.num_heads * b.head_dim}",
    )
    kv = b.num_kv_heads * b.head_dim
    for nm, s in (("k", k), ("v", v)):
        _need(s.rank == 3, f"{nm} must be [B, Skv, Hkv*D], got {s}")
        _need(s.dims[2] == kv, f"{nm} {s} last dim must be num_kv_heads*head_dim = {kv}")
        _need(s.dims[0] == q.dims[0], f"{nm} {s} batch differs from q {q}")
    _need(k.dims == v.dims, f"k {k} and v {v} must have equal shapes")
    custom = is_custom_mask(b.mask)
    if custom:
        _need(len(ins) == 4, f"mask kind {b.mask} needs a mask input")
        m = ins[3]
        _need(m.dtype is q.dtype, f"mask {m} must have q's dtype {q.dtype}")
        try:
            out = broadcast_dims(m.dims, (q.dims[0], b.num_heads, q.dims[1], k.dims[1]))
        except ShapeError:
            out = None
        _need(
            out == (q.dims[0], b.num_heads, q.dims[1], k.dims[1]),
            f"mask {m} must broadcast to [B, H, Sq, Skv] = "
            f"[{q.dims[0]},{b.num_heads},{q.dims[1]},{k.dims[1]}]",
        )
    else:
        _need(len(ins) == 3, f"a mask input was given but the mask kind is {b.mask} (use custom)")
    return q


@_rule(DepthwiseConv1dCausalBlock)
def _dwconv(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    x, w, pad = ins
    ksz = block.kernel_size  # type: ignore[attr-defined]
    _same_float(("input", "weight", "left_pad"), ins)
    _need(ksz >= 1, f"kernel_size must be >= 1, got {ksz}")
    _need(x.rank == 3, f"input must be [B, S, C], got {x}")
    c = x.dims[2]
    _need(isinstance(c, int), f"channels C of input {x} must be static (one filter each)")
    _need(
        w.dims in ((c, ksz), (c, 1, ksz), (c, 1, 1, ksz)),
        f"weight must be [C, K], [C, 1, K] or [C, 1, 1, K] with C={c}, K={ksz}, got {w}",
    )
    _need(
        pad.dims == (x.dims[0], ksz - 1, c),
        f"left_pad must be [B, K-1, C] = [{x.dims[0]},{ksz - 1},{c}], got {pad}",
    )
    return x


@_rule(DequantMatMulBlock)
def _dequant(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    from rlx.ir.hir_lower import dequant_op

    return dequant_op(block).infer(ins)  # type: ignore[arg-type]


@_rule(GatedDeltaNetBlock)
def _gdn(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    from rlx.ops.recurrent import GatedDeltaNet, GdnResult

    b: GatedDeltaNetBlock = block  # type: ignore[assignment]
    returns = GdnResult.FINAL_STATE if b.slot == 1 else GdnResult.OUTPUT
    return GatedDeltaNet(b.state_size, b.carry, returns).infer(ins)


@_rule(RopeBlock)
def _rope(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    b: RopeBlock = block  # type: ignore[assignment]
    x, cos, sin = ins
    _same_float(("x", "cos", "sin"), ins)
    _need(b.head_dim > 0, f"head_dim must be > 0, got {b.head_dim}")
    _need(
        0 < b.n_rot <= b.head_dim and b.n_rot % 2 == 0,
        f"n_rot must be even and in [2, head_dim={b.head_dim}], got {b.n_rot}",
    )
    _need(x.rank == 3, f"x must be [B, S, H*D], got {x}")
    hd = x.dims[2]
    _need(
        isinstance(hd, int) and hd % b.head_dim == 0,
        f"x {x} last dim must be a multiple of head_dim {b.head_dim}",
    )
    for nm, s in (("cos", cos), ("sin", sin)):
        _need(
            s.dims == (x.dims[1], b.n_rot // 2),
            f"{nm} must be [S, n_rot/2] = [{x.dims[1]},{b.n_rot // 2}], got {s}",
        )
    return x


@_rule(MirBlock)
def _mir(block: HirBlock, ins: tuple[Shape, ...]) -> Shape:
    op = block.op  # type: ignore[attr-defined]
    n = op.num_inputs()
    _need(n is None or n == len(ins), f"{op.mnemonic} expects {n} inputs, got {len(ins)}")
    return op.infer(ins)
