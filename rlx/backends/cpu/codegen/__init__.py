"""C generation for the CPU backend. In: fused MIR bodies (elementwise regions, row
kernels, matmul epilogues). Out: C source text that :mod:`rlx.backends.cpu.native` builds.

``elementwise``: the C type and op tables and the region renderer; ``loop``: the loop
nests over element layouts; ``rows``: row kernels (softmax, norms, the matmul epilogue);
``prelude``: the shared C prelude and vector-math declarations.
"""
