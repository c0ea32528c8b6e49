"""Kernels mirror the op families: ``rlx/backends/cpu/kernels/<family>.py`` has the name of
``rlx/ops/<family>.py`` and lists (in its ``ATTEMPTS`` table) exactly the kernels of the
ops that family defines; every factory it lists is defined in it or is a shared engine
(``rlx/backends/cpu/engines/``). A kernel placed in another family's file, an op listed by
the wrong module, or a kernel module without an op family fails here, naming it."""

from __future__ import annotations

import pkgutil
from collections.abc import Iterable, Mapping, Sequence

import pytest

from rlx.backends.cpu import dispatch, kernels
from rlx.backends.cpu.dispatch import KernelFactory
from rlx.ops import OPS
from rlx.ops.base import Op
from rlx.ops.elementwise import Unary
from rlx.ops.movement import Gather
from rlx.ops.reduce import Softmax

KERNELS_PKG = "rlx.backends.cpu.kernels"
ENGINES_PKG = "rlx.backends.cpu.engines"


def family_of(op_cls: type[Op]) -> str:
    """The op family: the name of the ``rlx/ops`` module defining the class."""
    module = op_cls.__module__
    assert module.startswith("rlx.ops."), f"{op_cls.__name__} is not a built-in op"
    return module.removeprefix("rlx.ops.")


def misplaced(
    tables: Mapping[str, Mapping[type[Op], Sequence[KernelFactory]]],
) -> list[str]:
    """What breaks the mirror in ``tables`` (kernel module name -> its ATTEMPTS)."""
    bad = []
    for module, table in tables.items():
        family = module.removeprefix(f"{KERNELS_PKG}.")
        for op_cls, attempts in table.items():
            if family_of(op_cls) != family:
                bad.append(
                    f"{op_cls.__name__} (rlx/ops/{family_of(op_cls)}.py) is listed by "
                    f"kernels/{family}.py, not kernels/{family_of(op_cls)}.py"
                )
            for f in attempts:
                home = f.__module__
                if home != module and not home.startswith(f"{ENGINES_PKG}."):
                    bad.append(
                        f"{f.__name__}, a kernel of {op_cls.__name__}, is defined in {home}: "
                        f"put it in {module} (or, shared by several families, in engines/)"
                    )
    return bad


def _kernel_modules() -> list[str]:
    return [m.name for m in pkgutil.iter_modules(kernels.__path__)]


def _tables() -> dict[str, Mapping[type[Op], Sequence[KernelFactory]]]:
    dispatch.load_kernels()
    out: dict[str, dict[type[Op], tuple[KernelFactory, ...]]] = {}
    for op_cls, attempts in dispatch.ORDER.items():
        out.setdefault(dispatch.ORIGIN[op_cls], {})[op_cls] = attempts
    return out


def test_every_kernel_module_is_named_after_an_op_family() -> None:
    import rlx.ops

    families = {m.name for m in pkgutil.iter_modules(rlx.ops.__path__)}
    stray = sorted(set(_kernel_modules()) - families)
    assert not stray, f"kernels/ modules without an rlx/ops family of that name: {stray}"


def test_every_op_family_with_a_cpu_kernel_has_its_kernel_module() -> None:
    tables = _tables()
    wanted = {family_of(op) for op in dispatch.ORDER if op.__module__.startswith("rlx.ops.")}
    have = {m.removeprefix(f"{KERNELS_PKG}.") for m in tables}
    assert wanted <= have, f"op families whose kernels are elsewhere: {sorted(wanted - have)}"
    assert set(dispatch.ORIGIN.values()) <= {f"{KERNELS_PKG}.{m}" for m in _kernel_modules()}


def test_each_kernel_module_lists_exactly_its_familys_kernels() -> None:
    assert misplaced(_tables()) == []


def test_each_family_module_lists_every_op_of_its_family_that_has_a_kernel() -> None:
    tables = _tables()
    for module, table in tables.items():
        family = module.removeprefix(f"{KERNELS_PKG}.")
        ops = {c for c in OPS.values() if c.__module__ == f"rlx.ops.{family}"}
        assert {c for c in dispatch.ORDER if c in ops} == set(table), module


def _planted(module: str, op_cls: type[Op], attempts: Iterable[KernelFactory]) -> dict:
    return {f"{KERNELS_PKG}.{module}": {op_cls: tuple(attempts)}}


def test_a_kernel_in_the_wrong_family_file_fails() -> None:
    from rlx.backends.cpu.kernels.movement import gather_kernel
    from rlx.backends.cpu.kernels.reduce import softmax_kernel

    # Softmax's kernel defined in kernels/movement.py, and listed there: both rules break
    moved = softmax_kernel.__module__
    try:
        softmax_kernel.__module__ = f"{KERNELS_PKG}.movement"
        (wrong_file,) = misplaced(_planted("reduce", Softmax, [softmax_kernel]))
        assert "softmax_kernel, a kernel of Softmax, is defined in" in wrong_file
        assert "kernels.movement: put it in rlx.backends.cpu.kernels.reduce" in wrong_file
    finally:
        softmax_kernel.__module__ = moved
    # Gather's kernel listed by kernels/reduce.py
    errors = misplaced(_planted("reduce", Gather, [gather_kernel]))
    assert any("Gather (rlx/ops/movement.py) is listed by kernels/reduce.py" in e for e in errors)
    assert any("gather_kernel, a kernel of Gather, is defined in" in e for e in errors)


def test_an_engine_factory_may_be_listed_by_any_family() -> None:
    from rlx.backends.cpu.kernels.reduce import native_softmax_kernel, softmax_kernel

    assert native_softmax_kernel.__module__ == f"{ENGINES_PKG}.rows"
    assert misplaced(_planted("reduce", Softmax, [native_softmax_kernel, softmax_kernel])) == []


def test_an_op_listed_by_two_modules_is_refused() -> None:
    from rlx.backends.cpu.kernels.elementwise import unary_kernel

    dispatch.load_kernels()
    with pytest.raises(TypeError, match="Unary are listed twice: by rlx.backends.cpu.kernels"):
        dispatch.register({Unary: (unary_kernel,)}, f"{KERNELS_PKG}.trig")
