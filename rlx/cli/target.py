"""What ``rlx inspect`` and ``rlx bench`` work on. In: a model directory, a known model
name or a graph file (``.rlx``, or ``.onnx`` imported by ``rlx.onnx.load``). Out: :class:`Target`: the source graph (f32, what FLOPs
are counted on), its symbols in order, inputs at a shape, and compiled graphs at a
precision and thread count.

A model directory becomes the sentence-embedding graph :class:`~rlx.models.SentenceEncoder`
runs (the encoder with its pooling head; symbols ``batch``, ``seq``); a graph file is
loaded with ``rlx.load`` (its symbols in the order the inputs first use them). A shape
such as ``8x128`` binds the symbols in that order.

Inputs are synthetic (the work of a dense encoder does not depend on the values): for a
model, ``HFModel.example_inputs`` (random non-pad token ids framed like a tokenized text,
no padding; so a sequence length of at least 2); for a graph file, standard-normal
floats, ones for integer and True for boolean inputs. INT8 is quantized once per target (a model calibrates on the built-in sentences;
a graph file on a few random batches, which only suits looking at the graph) and then
compiled again per thread count.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlx.errors import InputError
from rlx.ir.mir import Graph

__all__ = ["Target", "open_target"]


class Target:
    """A graph to compile, with its params (see the module docstring)."""

    def __init__(
        self, name: str, graph: Graph, params: Mapping[str, Any], model: Any = None
    ) -> None:
        self.name = name
        self.graph = graph
        self.params = dict(params)
        self.model = model  # an HFModel, or None for a graph file
        self._int8: Any = None
        self.quant_note = ""
        seen: list[str] = []
        for n in graph.input_nodes():
            for d in n.shape.dims:
                for s in getattr(d, "names", ()):
                    if s not in seen:
                        seen.append(s)
        self.symbols: tuple[str, ...] = tuple(seen)

    @property
    def description(self) -> str:
        if self.model is None:
            return f"graph file {self.name} ({len(self.graph)} nodes)"
        c = self.model.config
        return (
            f"{self.name}: {c.architecture}, {c.num_layers} layers, hidden {c.hidden_size}, "
            f"{c.num_heads} heads, sentence graph with its pooling ({len(self.graph)} nodes)"
        )

    def bind(self, dims: tuple[int, ...]) -> dict[str, int]:
        """Symbol bindings for a shape such as (8, 128); InputError when the count
        differs from the graph's symbols or a value is outside its declared bounds."""
        if len(dims) != len(self.symbols):
            shown = "x".join(map(str, dims))
            raise InputError(
                f"shape {shown} gives {len(dims)} values but graph {self.graph.name!r} has "
                f"{len(self.symbols)} symbolic dims {list(self.symbols)}"
            )
        out = dict(zip(self.symbols, dims))
        if self.model is not None and out.get("seq", 2) < 2:
            raise InputError(
                f"seq={out['seq']}: a model's inputs hold at least 2 tokens (the special "
                "tokens that frame a text); use a sequence length >= 2"
            )
        for s, v in out.items():
            lo, hi = self.graph.sym_bounds.get(s, (1, None))
            if v < lo or (hi is not None and v > hi):
                raise InputError(
                    f"{s}={v} is outside the bounds [{lo}, {hi if hi is not None else 'inf'}] "
                    f"graph {self.graph.name!r} declares"
                )
        return out

    def inputs(self, bindings: Mapping[str, int], seed: int = 0) -> dict[str, np.ndarray]:
        """Synthetic inputs at ``bindings`` (see the module docstring)."""
        if self.model is not None:  # token ids framed like a tokenized text, no padding
            return self.model.example_inputs(bindings["batch"], bindings["seq"], seed)
        rng = np.random.default_rng(seed)
        out: dict[str, np.ndarray] = {}
        for n in self.graph.input_nodes():
            name: str = n.op.name  # type: ignore[attr-defined]
            dims = n.shape.concrete(bindings)
            dt = n.shape.dtype
            if dt.is_float:
                out[name] = rng.standard_normal(dims).astype(dt.np)
            elif dt.is_bool:
                out[name] = np.ones(dims, bool)
            else:
                out[name] = np.ones(dims, dt.np)
        return out

    def _options(self, precision: str, threads: int | None) -> Any:
        from rlx.options import CompileOptions
        from rlx.passes.precision import PrecisionPolicy

        policy = PrecisionPolicy.AutoMixedBf16 if precision == "bf16" else None
        return CompileOptions(num_threads=threads, precision=policy, max_shape_plans=16)

    def quantized(self, bindings: Mapping[str, int]) -> Any:
        """The QuantizeResult of this target (computed once)."""
        if self._int8 is None:
            if self.model is not None:
                self._int8 = self.model.quantize(graph=self.graph)
                self.quant_note = "int8: calibrated on rlx's built-in sample sentences"
            else:
                from rlx.quant.api import quantize

                calib = [self.inputs(bindings, seed=s) for s in range(4)]
                self._int8 = quantize(
                    self.graph,
                    calib,
                    params=self.params,
                    options=self._options("f32", None),
                    rank_layers=False,
                )
                self.quant_note = (
                    "int8: calibrated on 4 random batches (fine for looking at the graph; "
                    "use rlx.quantize with real data for accuracy)"
                )
        return self._int8

    def compile(self, precision: str, threads: int | None, bindings: Mapping[str, int]) -> Any:
        """A CompiledGraph at ``precision`` on ``threads`` threads (None: rlx's default)."""
        from rlx.runtime.session import Session

        if precision == "int8":
            q = self.quantized(bindings)
            kept = {k: v for k, v in self.params.items() if k in set(q.graph.param_names)}
            return Session("cpu").compile(q.graph, self._options("f32", threads), params=kept)
        return Session("cpu").compile(
            self.graph, self._options(precision, threads), params=self.params
        )


def open_target(spec: str) -> Target:
    """A :class:`Target` for a ``.rlx`` or ``.onnx`` file, a model directory or a known
    model name."""
    path = Path(spec)
    if path.is_file() and path.suffix == ".onnx":
        from rlx.cli.onnx_cmds import onnx_target

        return onnx_target(path)
    if path.is_file():
        from rlx.ir.serialize import load

        graph, params = load(path)
        return Target(path.name, graph, params)
    from rlx.models.hf import load as load_hf
    from rlx.models.hf.layout import read_layout
    from rlx.models.known import resolve
    from rlx.models.sentence import sentence_graph

    model_dir = resolve(spec)
    layout = read_layout(model_dir)
    model = load_hf(layout.transformer_dir)
    return Target(str(spec), sentence_graph(model, layout.pooling), model.params, model)
