"""Transforms of MIR graphs and of traced Python functions: reverse mode (``grad``,
``value_and_grad``, ``vjp``), forward mode (``jvp``), Hessian-vector products (``hvp``)
and batching (``vmap``).

Each op's rules (``vjp``, ``jvp``, ``batch``) live beside the op in ``rlx/ops``; the
drivers here walk a graph and call them (``reverse.py``, ``forward.py``, ``hvp.py``,
``batching.py``); ``rlx/ops/rules.py`` holds the helpers rules share, ``check.py`` the
finite-difference checks. Each public function takes a :class:`~rlx.ir.mir.Graph` (and
returns a Graph) or a Python function (and returns what ``jax`` returns for it: a
function, or values), traced by ``rlx.jit``'s tracer (``rlx/frontends/trace/transforms.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlx.autodiff import batching as _batching
from rlx.autodiff import forward as _forward
from rlx.autodiff import reverse as _reverse
from rlx.autodiff.hvp import hvp
from rlx.autodiff.reverse import backward
from rlx.errors import AutodiffError
from rlx.ir.mir import Graph

__all__ = ["backward", "grad", "value_and_grad", "vjp", "jvp", "hvp", "vmap"]

Wrt = Sequence[int | str] | int | str | None


def _fns() -> Any:
    from rlx.frontends.trace import transforms

    return transforms


def _check_callable(f: Any, what: str) -> None:
    if not callable(f):
        raise AutodiffError(
            f"rlx.{what} needs a Graph or a Python function, given {type(f).__name__} {f!r:.60}"
        )


def grad(
    f: Graph | Callable[..., Any],
    wrt: Wrt = None,
    *,
    output: int = 0,
    argnums: int | Sequence[int] | None = None,
    has_aux: bool = False,
) -> Any:
    """Graph: the gradient graph of output ``output`` wrt ``wrt`` (names / node ids; None:
    every float param), see :func:`rlx.autodiff.reverse.grad`. Function: a function
    returning the gradient wrt its arguments ``argnums`` (default 0; a second positional
    argument is ``argnums`` too), like ``jax.grad``."""
    if isinstance(f, Graph):
        return _reverse.grad(f, wrt, output=output)
    _check_callable(f, "grad")
    nums = argnums if argnums is not None else (0 if wrt is None else wrt)
    return _fns().grad(f, nums, has_aux)  # type: ignore[arg-type]


def value_and_grad(
    f: Graph | Callable[..., Any],
    wrt: Wrt = None,
    *,
    output: int = 0,
    argnums: int | Sequence[int] | None = None,
    has_aux: bool = False,
) -> Any:
    """Graph: outputs ``[loss, grads...]`` (:func:`rlx.autodiff.reverse.value_and_grad`).
    Function: a function returning ``(value, grads)``, like ``jax.value_and_grad``."""
    if isinstance(f, Graph):
        return _reverse.value_and_grad(f, wrt, output=output)
    _check_callable(f, "value_and_grad")
    nums = argnums if argnums is not None else (0 if wrt is None else wrt)
    return _fns().value_and_grad(f, nums, has_aux)  # type: ignore[arg-type]


def vjp(f: Graph | Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Graph: ``vjp(graph, wrt)``, a graph with cotangent inputs ``ct0, ct1, ...`` and
    outputs ``[*outputs, *cotangents of wrt]``. Function: ``vjp(fn, *primals) ->
    (out, vjp_fn)``, like ``jax.vjp``."""
    if isinstance(f, Graph):
        return _reverse.vjp(f, *args, **kw)
    _check_callable(f, "vjp")
    return _fns().vjp(f, *args, **kw)


def jvp(f: Graph | Callable[..., Any], *args: Any, **kw: Any) -> Any:
    """Graph: ``jvp(graph, wrt)``, a graph with tangent inputs ``t_<name>`` (``wrt``
    order) and outputs ``[*outputs, *their tangents]``. Function: ``jvp(fn, primals,
    tangents) -> (out, tangent_out)``, like ``jax.jvp``."""
    if isinstance(f, Graph):
        return _forward.jvp(f, *args, **kw)
    _check_callable(f, "jvp")
    return _fns().jvp(f, *args, **kw)


def vmap(
    f: Graph | Callable[..., Any],
    in_axes: int | None | Mapping[str, int | None] | Sequence[int | None] = 0,
    out_axes: int | None | Sequence[int | None] = 0,
    **kw: Any,
) -> Any:
    """Graph: :func:`rlx.autodiff.batching.vmap` (``in_axes`` by input name, ``size=``
    the batch size, an int or a symbol name). Function: a function mapped over the
    ``in_axes`` of its arguments, like ``jax.vmap``."""
    if isinstance(f, Graph):
        return _batching.vmap(f, in_axes, out_axes, **kw)  # type: ignore[arg-type]
    _check_callable(f, "vmap")
    return _fns().vmap(f, in_axes, out_axes)  # type: ignore[arg-type]
