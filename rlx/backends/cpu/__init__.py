"""The CPU backend. In: a MIR graph (from ``Session("cpu").compile``). Out: a compiled
program that runs as one arena and a flat schedule of kernel closures.

Modules: ``planner`` (arena layout), ``kernels*`` (the kernel table, one factory per op
that has a fast path; every other op runs its reference), ``executor`` (arena + schedule),
``program`` (what compile produces), ``cache`` (the compile cache), ``report`` (schedule,
memory and timing report, Chrome trace), ``calibrate`` (activation-range calibration for
INT8 quantization), ``native`` (C kernels built and cached by content).
"""
