"""The CPU backend. In: a MIR graph (from ``Session("cpu").compile``). Out: a compiled
program that runs as one arena and a flat schedule of kernel closures.

Modules: ``planner`` (arena layout), ``dispatch`` (the kernel table: each op's kernel
factories in the order they are tried; an op without one runs its reference),
``kernels`` (one module per op family, named as in ``rlx/ops``), ``engines`` (fast paths
several families call: GEMMs, generated regions and row kernels, direct convolution),
``executor`` (arena + schedule), ``program`` (what compile produces), ``cache`` (the
compile cache), ``report`` (schedule, memory and timing report, Chrome trace),
``threads`` (the thread pool rules), ``codegen`` (C generation), ``native`` (C kernels
built and cached by content).
"""
