"""The compiled training step. In: a model graph whose output ``loss_output`` is a scalar
loss, an optimizer (:mod:`rlx.train.optim`) and the params' initial values. Out: a
:class:`TrainStep` whose ``step(inputs)`` runs forward, backward, gradient clipping and the
optimizer update as ONE compiled graph and returns the loss; the params and the
optimizer's state live in that compiled graph's param store and are updated in place by
``assign`` nodes (``rlx/ops/state.py``) that run after every other node (Adam and AdamW:
one ``adam_update`` node per param writes the param and its ``m``, ``v`` in one pass).

The step graph adds to the model graph: the backward pass (:func:`rlx.autodiff.backward`,
after ``fuse_cross_entropy`` made each spelled-out cross-entropy one
``softmax_cross_entropy`` node, so that its backward is ``softmax_cross_entropy_backward``),
two inputs, ``train.lr`` (f64 rank 0: the learning rate of this step, from the schedule,
so a schedule never recompiles) and the params ``train.step`` (f64 rank 0: steps taken)
and the optimizer's state (``adam.m.<name>``...). Split mode, for data-parallel training:
``grads(inputs)`` runs a compiled loss-and-gradients graph and ``apply(grads)`` a compiled
update graph taking the gradients as inputs ``grad.<name>``; ``step`` is ``apply(grads())``
in one graph. ``recompute``: see :mod:`rlx.train.recompute`.

State files: :meth:`TrainStep.save` writes the step graph with every param (model params,
optimizer state, ``train.step``) with :func:`rlx.save`; :meth:`TrainStep.load` restores
them, and the next steps give the same losses as if training had not stopped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlx.autodiff.reverse import backward
from rlx.dtype import DType
from rlx.errors import AutodiffError, InputError
from rlx.ir.mir import Graph, NodeId
from rlx.ops.rules import is_diff_dtype, zeros
from rlx.options import CompileOptions
from rlx.passes.fusion_loss import CrossEntropyFusion
from rlx.runtime.compiled import CompiledGraph
from rlx.runtime.session import Session
from rlx.train.optim import Optimizer, UpdateCtx, clip_by_global_norm

__all__ = ["TrainStep", "LR_INPUT", "STEP_PARAM", "GRAD_PREFIX"]

LR_INPUT = "train.lr"
STEP_PARAM = "train.step"
GRAD_PREFIX = "grad."

Schedule = Callable[[int], float]


class TrainStep:
    """Forward + backward + update compiled once (module docstring).

    ``graph``: the model, output ``loss_output`` a one-element float loss. ``params``:
    every param's initial value (name -> array). ``trainable``: the param names to update
    (default every float param); ``clip_norm``: clip the gradients to this global 2-norm;
    ``schedule``: step number (0-based) -> learning rate (default ``optimizer.lr``);
    ``options``: CompileOptions (``freeze_params`` must stay off); ``recompute``: True, or
    the forward node ids to keep, to recompute the other activations in the backward
    pass (:mod:`rlx.train.recompute`)."""

    def __init__(
        self,
        graph: Graph,
        optimizer: Optimizer,
        params: Mapping[str, Any],
        *,
        loss_output: int = 0,
        trainable: Sequence[str] | None = None,
        clip_norm: float | None = None,
        schedule: Schedule | None = None,
        options: CompileOptions | None = None,
        recompute: bool | Sequence[NodeId] = False,
    ):
        if not isinstance(optimizer, Optimizer):
            raise InputError(
                f"TrainStep: optimizer must be an rlx.train Optimizer (SGD, Adam, AdamW), "
                f"given {type(optimizer).__name__}"
            )
        self.options = options or CompileOptions()
        if self.options.freeze_params:
            raise InputError(
                "TrainStep: options.freeze_params must be False (the params change every step)"
            )
        graph.verify()
        self.model = graph
        self.optimizer = optimizer
        self.schedule = schedule
        self.clip_norm = clip_norm
        self.loss_output = loss_output
        for name in (LR_INPUT, STEP_PARAM):
            if name in graph.input_names or name in graph.param_names:
                raise InputError(f"TrainStep: the name {name!r} is reserved for the step graph")
        self.trainable = _trainable(graph, trainable)
        self._init = _initial(graph, params)
        self._recompute = recompute
        self.step_graph, self._state = self._build()
        self._init.update(self._state)
        self._steps = 0
        self._compiled: dict[str, CompiledGraph] = {}
        self._holder: str | None = None  # which compiled graphs hold the latest values
        self._grads_stale = False

    # ---- building -----------------------------------------------------------------

    def _forward_backward(self, name: str) -> tuple[Graph, NodeId, list[NodeId]]:
        """A copy of the model extended with the backward pass: (graph, loss, grads)."""
        g = self.model.copy(name)
        if not -len(g.outputs) <= self.loss_output < len(g.outputs):
            raise InputError(
                f"TrainStep: loss_output {self.loss_output} out of range: graph "
                f"{g.name!r} has {len(g.outputs)} outputs"
            )
        loss = g.outputs[self.loss_output]
        node = g.nodes[loss]
        if node.shape.numel != 1 or not is_diff_dtype(node.dtype):
            raise AutodiffError(
                f"TrainStep: the loss {node.label} must be one float element, got {node.shape}",
                node=loss,
                loc=node.loc,
            )
        nforward = len(g.nodes)
        if self._fuses_losses():
            g = CrossEntropyFusion().run(g)
            loss, nforward = g.outputs[self.loss_output], len(g.nodes)
            node = g.nodes[loss]
        wrt = [n.id for n in g.param_nodes() if n.op.name in self.trainable]  # type: ignore[attr-defined]
        seed = g.constant(np.ones(node.shape.dims, dtype=node.dtype.np))
        found = backward(g, {loss: seed}, wrt)
        grads = [c if c is not None else zeros(g, w) for c, w in zip(found, wrt)]
        if self._recompute is not False:
            from rlx.train.recompute import recompute_activations

            keep = None if self._recompute is True else list(self._recompute)  # type: ignore[arg-type]
            g, remap = recompute_activations(g, nforward, keep)
            loss, grads = remap[loss], [remap[d] for d in grads]
        return g, loss, grads

    def _fuses_losses(self) -> bool:
        """Whether the loss chains become fused ops before differentiating (so the backward
        pass is their backward ops): unless fusion or ``fuse_cross_entropy`` is off, or
        ``recompute`` names forward node ids (which the rewrite would renumber)."""
        o = self.options
        named = self._recompute is not False and self._recompute is not True
        return o.fuse and "fuse_cross_entropy" not in o.disabled_passes and not named

    def _update(
        self, g: Graph, grads: Mapping[str, NodeId]
    ) -> tuple[dict[str, np.ndarray], NodeId | None]:
        """Add lr, the step counter, clipping, the optimizer and the assigns to ``g``;
        returns the new state params' initial values and the global grad norm node."""
        lr = g.input(LR_INPUT, (), DType.F64)
        t = g.param(STEP_PARAM, (), DType.F64)
        t1 = g.add(t, g.constant(np.float64(1.0)))
        names = list(grads)
        ids = [grads[k] for k in names]
        norm = None
        if self.clip_norm is not None:
            ids, norm = clip_by_global_norm(g, ids, self.clip_norm)
        params = {n.op.name: n.id for n in g.param_nodes()}  # type: ignore[attr-defined]
        ctx = UpdateCtx(g, lr, t1, fused=True)  # compiled for the CPU backend (_compile)
        news = {k: self.optimizer.update(ctx, k, params[k], d) for k, d in zip(names, ids)}
        state: dict[str, np.ndarray] = {STEP_PARAM: np.zeros((), np.float64)}
        kept = {k: node for k, (node, _) in ctx.writes.items()} | ctx.inplace
        for k, node in kept.items():
            shape = g.shape(node)
            state[k] = np.zeros(shape.concrete(), dtype=shape.dtype.np)
        for k, new in news.items():
            if new is not None:  # None: updated in place by the optimizer's update node
                g.assign(params[k], new)
        for node, value in ctx.writes.values():
            g.assign(node, value)
        g.assign(t, t1)
        return state, norm

    def _build(self) -> tuple[Graph, dict[str, np.ndarray]]:
        g, loss, grads = self._forward_backward(f"{self.model.name}.train")
        state, _ = self._update(g, dict(zip(self._wrt_names(g), grads)))
        g.set_outputs([loss])
        return g.verify(), state

    def _wrt_names(self, g: Graph) -> list[str]:
        return [n.op.name for n in g.param_nodes() if n.op.name in self.trainable]  # type: ignore[attr-defined]

    def _split_graphs(self) -> tuple[Graph, Graph]:
        """The loss-and-grads graph and the update graph of split mode."""
        g, loss, grads = self._forward_backward(f"{self.model.name}.grads")
        g.set_outputs([loss, *grads])
        u = Graph(f"{self.model.name}.apply")
        ids: dict[str, NodeId] = {}
        for n in self.model.param_nodes():
            if n.op.name in self.trainable:  # type: ignore[attr-defined]
                u.param(n.op.name, n.shape)  # type: ignore[attr-defined]
        for k in self._wrt_names(g):
            ids[k] = u.input(GRAD_PREFIX + k, g.shape(grads[len(ids)]))
        _, norm = self._update(u, ids)
        t = next(n.id for n in u.param_nodes() if n.op.name == STEP_PARAM)  # type: ignore[attr-defined]
        u.set_outputs([norm if norm is not None else t])
        return g.verify(), u.verify()

    # ---- compiled graphs and where the values live -----------------------------------

    def _compile(self, key: str) -> CompiledGraph:
        cg = self._compiled.get(key)
        if cg is None:
            if key == "step":
                graph = self.step_graph
            else:
                grads, upd = self._split_graphs()
                self._compiled["grads"] = Session("cpu").compile(grads, self.options)
                self._compiled["apply"] = Session("cpu").compile(upd, self.options)
                return self._compiled[key]
            cg = self._compiled[key] = Session("cpu").compile(graph, self.options)
        return cg

    @property
    def compiled(self) -> CompiledGraph:
        """The compiled step graph (compiled on first use)."""
        return self._compile("step")

    def _use(self, mode: str) -> None:
        """Make the compiled graphs of ``mode`` ("step" or "split") hold the latest values."""
        if self._holder == mode:
            return
        values = self.state_dict() if self._holder is not None else self._init
        if mode == "step":
            self._compile("step").set_params(values)
        else:
            grads, upd = self._compile("grads"), self._compile("apply")
            grads.set_params({k: values[k] for k in grads.param_names})
            upd.set_params({k: values[k] for k in upd.param_names})
            self._grads_stale = False
        self._holder = mode

    def _read(self, cg: CompiledGraph, names: Sequence[str]) -> dict[str, np.ndarray]:
        # the live param store of the compiled graph (read-only views): copies
        live = cg._params
        return {k: np.array(live[k]) for k in names}

    # ---- running ------------------------------------------------------------------

    def lr(self) -> float:
        """The learning rate of the next step."""
        if self.schedule is None:
            return float(self.optimizer.lr)
        return float(self.schedule(self._steps))

    def _feed(self, inputs: Mapping[str, Any], lr: bool = True) -> dict[str, Any]:
        """The model's inputs checked to be a dict, plus ``train.lr`` (with ``lr``)."""
        if not isinstance(inputs, Mapping):
            raise InputError(
                f"TrainStep takes a dict of input name -> array, given {type(inputs).__name__}; "
                f"inputs: {self.model.input_names}"
            )
        if LR_INPUT in inputs:
            raise InputError(f"TrainStep: {LR_INPUT!r} is fed by the step (from the schedule)")
        return {**inputs, LR_INPUT: np.float64(self.lr())} if lr else dict(inputs)

    def step(self, inputs: Mapping[str, Any]) -> float:
        """One training step on ``inputs`` (the model's inputs): returns the loss (before
        the update); params and optimizer state are updated in place."""
        self._use("step")
        feed = self._feed(inputs)
        (loss,) = self.compiled.run(feed)
        self._steps += 1
        return float(np.asarray(loss).reshape(-1)[0])

    __call__ = step

    def grads(self, inputs: Mapping[str, Any]) -> tuple[float, dict[str, np.ndarray]]:
        """Split mode: ``(loss, {param name: gradient})`` at the current params, nothing
        updated."""
        self._use("split")
        cg = self._compile("grads")
        if self._grads_stale:
            cg.set_params(self._read(self._compile("apply"), self._wrt_names(self.model)))
            self._grads_stale = False
        loss, *gs = cg.run(self._feed(inputs, lr=False))
        names = self._wrt_names(self.model)
        return float(np.asarray(loss).reshape(-1)[0]), dict(zip(names, gs, strict=True))

    def apply(self, grads: Mapping[str, Any]) -> None:
        """Split mode: update the params from ``grads`` (param name -> gradient, e.g.
        averaged over workers) with the optimizer (and clipping): what ``step`` does after
        its backward pass."""
        self._use("split")
        names = self._wrt_names(self.model)
        missing = [k for k in names if k not in grads]
        unknown = [k for k in grads if k not in names]
        if missing or unknown:
            raise InputError(
                f"apply: gradients needed for exactly the trainable params {names}; "
                f"missing {missing}, unknown {unknown}"
            )
        feed = {GRAD_PREFIX + k: grads[k] for k in names}
        feed[LR_INPUT] = np.float64(self.lr())
        self._compile("apply").run(feed)
        self._steps += 1
        self._grads_stale = True

    # ---- values and state files -----------------------------------------------------

    @property
    def steps(self) -> int:
        """Steps taken (``step`` or ``apply`` calls, restored by ``load``)."""
        return self._steps

    def params(self) -> dict[str, np.ndarray]:
        """The model params' current values (copies)."""
        state = self.state_dict()
        return {k: state[k] for k in self.model.param_names}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Every value the training carries (copies): the model params, the optimizer's
        state params and ``train.step``."""
        if self._holder is None:
            return {k: np.array(v) for k, v in self._init.items()}
        if self._holder == "step":
            return self._read(self.compiled, list(self._init))
        upd, grads = self._compile("apply"), self._compile("grads")
        out = self._read(upd, upd.param_names)
        out.update(self._read(grads, [k for k in grads.param_names if k not in out]))
        return {k: out[k] for k in self._init}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore values from :meth:`state_dict` (every name, the same shapes)."""
        missing = [k for k in self._init if k not in state]
        unknown = [k for k in state if k not in self._init]
        if missing or unknown:
            raise InputError(
                f"load_state_dict: expected the values {sorted(self._init)}; "
                f"missing {missing}, unknown {unknown}"
            )
        values = {k: np.array(state[k], dtype=self._init[k].dtype) for k in self._init}
        for k, v in values.items():
            if v.shape != self._init[k].shape:
                raise InputError(
                    f"load_state_dict: {k!r} has shape {v.shape}, expected {self._init[k].shape}"
                )
        steps = float(values[STEP_PARAM])
        self._init = values
        self._holder = None
        self._steps = int(steps)

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the step graph and every value (:meth:`state_dict`) with ``rlx.save``."""
        from rlx.ir.serialize import save

        save(self.step_graph, path, self.state_dict())

    def load(self, path: str | os.PathLike[str]) -> None:
        """Restore the values a :meth:`save` of the same training setup wrote."""
        from rlx.ir.serialize import load

        _, values = load(path)
        self.load_state_dict(values)

    def __repr__(self) -> str:
        return (
            f"<TrainStep {self.model.name!r}: {self.optimizer!r}, "
            f"{len(self.trainable)} trainable params, {self._steps} steps>"
        )


def _trainable(graph: Graph, trainable: Sequence[str] | None) -> list[str]:
    floats = [n.op.name for n in graph.param_nodes() if is_diff_dtype(n.dtype)]  # type: ignore[attr-defined]
    if trainable is None:
        if not floats:
            raise InputError(f"TrainStep: graph {graph.name!r} has no float params to train")
        return floats
    if isinstance(trainable, str):
        trainable = [trainable]
    bad = [k for k in trainable if k not in graph.param_names]
    if bad:
        raise InputError(
            f"TrainStep: trainable {bad} are not params of graph {graph.name!r}; "
            f"params: {graph.param_names}"
        )
    nonfloat = [k for k in trainable if k not in floats]
    if nonfloat:
        raise InputError(f"TrainStep: trainable params {nonfloat} are not float")
    return [k for k in floats if k in set(trainable)]


def _initial(graph: Graph, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Checked copies of every param's initial value."""
    if not isinstance(params, Mapping):
        raise InputError(f"TrainStep: params must be a dict of name -> array, given {params!r}")
    nodes = {n.op.name: n for n in graph.param_nodes()}  # type: ignore[attr-defined]
    missing = [k for k in nodes if k not in params]
    unknown = [k for k in params if k not in nodes]
    if missing or unknown:
        raise InputError(
            f"TrainStep: params must give every param of graph {graph.name!r}; "
            f"missing {missing}, unknown {unknown}"
        )
    out = {}
    for k, n in nodes.items():
        a = np.array(params[k], dtype=n.dtype.np)
        if not n.shape.is_static or a.shape != n.shape.concrete():
            raise InputError(f"TrainStep: param {k!r} is {n.shape}, given shape {a.shape}")
        out[k] = a
    return out
