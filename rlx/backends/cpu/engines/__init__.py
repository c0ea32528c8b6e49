"""Fast paths several kernel families call. In: NumPy views of arena slots (or scratch)
and the kernel context. Out: closures, or None when the path does not apply (the caller
keeps its own).

``blas`` (2-D GEMMs into ``out``, operands as ``[batch, rows, cols]``), ``sgemm`` (rlx's
packed f32 GEMM with its epilogue, chosen against BLAS by measurement), ``qgemm`` (the
int8 GEMM with its fused epilogue, and its exact f64 fallback), ``intgemm`` (exact
integer products), ``lowp_lib`` / ``lowp_gemm`` (the bf16/f16 library: casts, GEMMs),
``region`` (generated elementwise C loops: build, load, bind), ``rows`` (generated row
kernels: softmax, norms, matmul epilogues), ``conv`` (direct f32 convolution and pooling,
strided window views), ``weights`` (weights derived once: packed, decoded), ``lowered``
(a backward op's lowering to elementwise ops run as one region).
"""
