"""The INT8 schedule of all-MiniLM-L6-v2 (dynamic per-token u8, the SentenceEncoder's
default int8): every matmul is an integer GEMM with its bias / GELU / residual in the
native kernel's epilogue, so no elementwise kernel reads an integer matmul's output."""

from __future__ import annotations

import pytest

ELEMENTWISE = {"unary", "binary", "elementwise_region", "cast"}


@pytest.mark.slow
def test_no_elementwise_kernel_after_an_integer_matmul(minilm_encoders):
    c = minilm_encoders["int8"].compiled
    g = c.graph
    qm = [n for n in g.nodes if n.op.mnemonic == "dynamic_qmatmul"]
    assert len(qm) == 36  # 6 layers x (q, k, v, out, ff1, ff2)
    ids = {n.id for n in qm}
    readers = [n for n in g.nodes if ids & set(n.inputs)]
    assert readers and not [n for n in readers if n.op.mnemonic in ELEMENTWISE]
    assert sum(n.op.act is not None for n in qm) == 6  # the FFN GELU, fused
    kinds = {k.kind.value for k in c.report().kernels if k.op == "dynamic_qmatmul"}
    assert kinds == {"native"}
