"""The CPU kernels, one module per op family: ``kernels/<family>.py`` holds the kernel
factories of the ops of ``rlx/ops/<family>.py`` and ends with its ``ATTEMPTS`` table
(each op's factories in the order they are tried). The table itself, the kernel context
and the default kernel are in :mod:`rlx.backends.cpu.dispatch`, re-exported here; the fast
paths several families share are in :mod:`rlx.backends.cpu.engines`."""

from rlx.backends.cpu.dispatch import (
    F32,
    KERNELS,
    ORDER,
    Kernel,
    KernelCtx,
    KernelFactory,
    KernelKind,
    ScratchPool,
    factory_kind,
    is_lowp,
    kernel_kind,
    kind,
    load_kernels,
    lowp,
    reference_kernel,
    register,
)

__all__ = [
    "F32",
    "KERNELS",
    "ORDER",
    "Kernel",
    "KernelCtx",
    "KernelFactory",
    "KernelKind",
    "ScratchPool",
    "factory_kind",
    "is_lowp",
    "kernel_kind",
    "kind",
    "load_kernels",
    "lowp",
    "reference_kernel",
    "register",
]
