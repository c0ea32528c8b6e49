"""ONNX model -> rlx graph. In: a path to a .onnx file, its bytes, or an ``onnx.ModelProto``.
Out: an :class:`OnnxModel` (a :class:`~rlx.ir.module.GraphModule` at MIR stage plus its
params, as ``rlx.models.hf`` returns them).

Steps: read (a truncated or non-ONNX file is an error), the initializers' bytes,
``onnx.checker`` (on stubs of the large initializers, ``fastcheck.py``), opsets (6 to the
newest the installed onnx knows), graph inputs (named dims -> symbolic dims, unknown dims ->
a symbol named after the input and axis), initializers (float tensors of more than
:data:`CONST_LIMIT` elements -> params, the rest -> constants, so shape arithmetic folds),
then each node through the converter table (``ops/``). A node whose inputs are all known
is folded at import by rlx's reference interpreter; shape arithmetic on symbolic dims
(``Shape`` of a dynamic axis -> ``Gather`` -> ``Concat`` -> ``Reshape``) is evaluated over
symbols by ``symbolic.py``. Nothing is returned half-built: any
error leaves no state behind."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import ModelProto, NodeProto, ValueInfoProto

from rlx.dtype import DType
from rlx.errors import RlxError
from rlx.frontends.onnx import fastcheck
from rlx.frontends.onnx.context import ImportState, NodeCtx, node_label
from rlx.frontends.onnx.dtypes import to_dtype
from rlx.frontends.onnx.errors import OnnxImportError, OnnxUnsupportedError
from rlx.frontends.onnx.ops import lookup
from rlx.frontends.onnx.symbolic import SymValue, evaluate, register_carriers
from rlx.frontends.onnx.tensors import to_array
from rlx.ir.mir import Graph
from rlx.ir.module import GraphModule
from rlx.shape import Shape

__all__ = ["OnnxModel", "load", "read_model", "MIN_OPSET", "CONST_LIMIT"]

MIN_OPSET = 6  # opset 6: legacy broadcast and BatchNormalization-6 forms (ops/legacy.py)
CONST_LIMIT = 64  # initializers with at most this many elements (or non-float) are constants
NO_FOLD = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "If",
        "Loop",
        "Scan",
    }
)


@dataclass(frozen=True)
class OnnxModel:
    """An imported ONNX model: ``module`` (MIR), ``params`` (initializer name -> array),
    ``inputs`` (graph input name -> Shape, symbolic dims included), ``outputs`` (output
    names, in order), ``opsets`` (domain -> version) and ``constant_inputs`` (graph inputs
    folded at import)."""

    module: GraphModule
    params: Mapping[str, np.ndarray]
    inputs: Mapping[str, Shape]
    outputs: tuple[str, ...]
    opsets: Mapping[str, int]
    constant_inputs: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def graph(self) -> Graph:
        return self.module.into_graph()

    def compile(self, options: Any = None, **kw: Any) -> Any:
        """A CompiledGraph for the CPU with the params set (``kw``: CompileOptions fields)."""
        from rlx.options import CompileOptions
        from rlx.runtime.session import Session

        opts = options or CompileOptions(**kw)
        return Session("cpu").compile(self.module, opts, params=dict(self.params))

    def feeds(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """``values`` without the inputs folded at import (each must equal its folded value)."""
        out = {}
        for k, v in values.items():
            c = self.constant_inputs.get(k)
            if c is None:
                out[k] = v
            elif not np.array_equal(np.asarray(v), c):
                raise OnnxImportError(
                    f"input {k!r} was folded at import as {c.tolist()!r}; given a different value"
                )
        return out

    def __repr__(self) -> str:
        ins = ", ".join(f"{k}: {v}" for k, v in self.inputs.items())
        return f"OnnxModel({ins} -> {list(self.outputs)}, opsets={dict(self.opsets)})"


def read_model(src: str | Path | bytes | ModelProto) -> tuple[ModelProto, Path | None]:
    """The ModelProto of ``src`` and its directory (None for bytes or a ModelProto)."""
    if isinstance(src, ModelProto):
        return src, None
    if isinstance(src, bytes | bytearray):
        data, base, what = bytes(src), None, "the given bytes"
    else:
        path = Path(src)
        if not path.is_file():
            raise OnnxImportError(f"ONNX file {str(path)!r} does not exist or is not a file")
        data, base, what = path.read_bytes(), path.parent, repr(str(path))
    m = ModelProto()
    try:
        m.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as e:
        raise OnnxImportError(
            f"{what} is not a readable ONNX model (truncated or not protobuf, "
            f"{len(data)} bytes): {e}"
        ) from None
    if not m.HasField("graph") or (not m.graph.node and not m.graph.output):
        raise OnnxImportError(f"{what} holds no ONNX graph ({len(data)} bytes; truncated?)")
    return m, base


def _opsets(m: ModelProto) -> dict[str, int]:
    ops = {("" if o.domain == "ai.onnx" else o.domain): int(o.version) for o in m.opset_import}
    if "" not in ops:
        return ops  # only other domains (ai.onnx.ml, training): their nodes name themselves
    newest = onnx.defs.onnx_opset_version()
    if not MIN_OPSET <= ops[""] <= newest:
        raise OnnxUnsupportedError(
            f"ai.onnx opset {ops['']}: rlx imports opsets {MIN_OPSET} to {newest} "
            f"(the newest the installed onnx {onnx.__version__} knows)",
            op_type="opset",
            opset=ops[""],
        )
    return ops


def input_shape(g: Graph, vi: ValueInfoProto, dims: Sequence[Any] | None) -> Shape:
    """The Shape of graph input ``vi``: static dims, named dims as symbols, unknown dims as
    ``<input>_<axis>`` symbols (``dims`` overrides)."""
    tt = vi.type.tensor_type
    if vi.type.WhichOneof("value") != "tensor_type":
        raise OnnxUnsupportedError(
            f"graph input {vi.name!r}: a {vi.type.WhichOneof('value')} value; rlx imports "
            f"tensors only",
            op_type=f"type:{vi.type.WhichOneof('value')}",
        )
    dt = to_dtype(tt.elem_type, f"graph input {vi.name!r}")
    if dims is not None:
        out = [g.sym(d) if isinstance(d, str) else int(d) for d in dims]
        return Shape(out, dt)
    if not tt.HasField("shape"):
        raise OnnxImportError(
            f"graph input {vi.name!r} has no shape (unknown rank); give its dims in "
            f"load(..., input_dims={{{vi.name!r}: [...]}})"
        )
    out = []
    for i, d in enumerate(tt.shape.dim):
        if d.HasField("dim_value"):
            out.append(int(d.dim_value))
        else:
            name = d.dim_param if d.HasField("dim_param") else f"{vi.name}_{i}"
            name = "".join(c if c.isalnum() or c == "_" else "_" for c in name)
            out.append(g.sym(name))
    return Shape(out, dt)


def convert_nodes(st: ImportState, nodes: Sequence[NodeProto]) -> None:
    """Convert ``nodes`` (topologically ordered) into ``st.g``."""
    for node in nodes:
        domain = "" if node.domain == "ai.onnx" else node.domain
        opset = st.opsets.get(domain)
        if opset is None:
            raise OnnxImportError(f"{node_label(node)}: domain {domain!r} is not imported")
        entry = lookup(domain, node.op_type, opset)
        if entry is None:
            raise OnnxUnsupportedError(
                f"{node_label(node)}: rlx cannot import ONNX op {node.op_type} (domain "
                f"{domain or 'ai.onnx'}, opset {opset})",
                op_type=node.op_type,
                domain=domain,
                opset=opset,
            )
        for name in node.input:
            if name and not st.has(name):
                raise OnnxImportError(f"{node_label(node)}: input {name!r} is not defined")
        ins = [n for n in node.input if n]
        if any(n in st.syms for n in ins) and all(
            n in st.syms or st.const(n) is not None for n in ins
        ):
            value = evaluate(st, node, opset)  # shape arithmetic over symbolic dims
            if value is not None:
                _bind(st, node, [value])
                continue
        if ins and node.op_type not in NO_FOLD and all(st.const(n) is not None for n in ins):
            _fold(st, node, entry.fn, opset)
            continue
        try:
            outs = entry.fn(NodeCtx(st, node, opset))
        except RlxError:
            raise
        except Exception as e:  # a converter bug or an input form it does not expect
            raise OnnxImportError(
                f"{node_label(node)} (domain {domain or 'ai.onnx'}, opset {opset}) could not "
                f"be converted: {type(e).__name__}: {e}"
            ) from e
        _bind(st, node, outs)


def _bind(st: ImportState, node: NodeProto, outs: Any) -> None:
    if isinstance(outs, int | np.ndarray | SymValue):
        outs = [outs]
    for name, v in zip(node.output, outs, strict=False):
        if not name or v is None:
            continue
        if isinstance(v, SymValue):
            st.syms[name] = v
            st.ids.pop(name, None)
        elif isinstance(v, np.ndarray):
            st.consts[name] = v
            st.ids.pop(name, None)
        else:
            st.ids[name] = int(v)
    made = sum(1 for n, v in zip(node.output, outs, strict=False) if n and v is not None)
    if made < sum(1 for n in node.output if n):
        raise OnnxUnsupportedError(
            f"{node_label(node)}: rlx makes {made} of its {len(node.output)} outputs",
            op_type=node.op_type,
            domain=node.domain,
        )


def _fold(st: ImportState, node: NodeProto, fn: Any, opset: int) -> None:
    sub = ImportState(Graph("fold"), st.opsets)
    for n in node.input:
        if n:
            sub.consts[n] = st.const(n)  # type: ignore[assignment]
    outs = fn(NodeCtx(sub, node, opset))
    outs = [outs] if isinstance(outs, int | np.ndarray) else list(outs)
    ids = [o for o in outs if o is not None and not isinstance(o, np.ndarray)]
    vals: list[np.ndarray] = []
    if ids:
        sub.g.set_outputs(ids)
        vals = sub.g.evaluate()
    it = iter(vals)
    res = [o if o is None or isinstance(o, np.ndarray) else next(it) for o in outs]
    _bind(st, node, res)


def load(
    src: str | Path | bytes | ModelProto,
    *,
    constant_inputs: Mapping[str, Any] | None = None,
    input_dims: Mapping[str, Sequence[int | str]] | None = None,
    check: bool = True,
) -> OnnxModel:
    """Import an ONNX model (see the module docstring). ``constant_inputs`` fixes graph
    inputs to values folded at import (shape inputs of Reshape, Slice, ...); ``input_dims``
    overrides input dims (ints, or names for symbolic dims)."""
    m, base = read_model(src)
    arrays = {t.name: to_array(t, base) for t in m.graph.initializer}  # checks external data
    if check:
        try:  # the tensors were read and checked above: the checker sees stubs of them
            fastcheck.check_model(m)
        except onnx.checker.ValidationError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise OnnxImportError(f"the model fails the onnx checker: {first}") from None
    opsets = _opsets(m)
    g = Graph(m.graph.name or "onnx")
    st = ImportState(g, opsets)
    constant_inputs = dict(constant_inputs or {})
    input_dims = dict(input_dims or {})
    params: dict[str, np.ndarray] = {}
    inits = arrays
    for name, arr in arrays.items():
        if arr.dtype.kind in "fc" and arr.size > CONST_LIMIT:
            params[name] = arr
            st.ids[name] = g.param(name, Shape(arr.shape, DType.from_numpy(arr.dtype)))
        else:
            st.consts[name] = arr
    inputs: dict[str, Shape] = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue  # IR < 4 lists initializers among the inputs
        shape = input_shape(g, vi, input_dims.get(vi.name))
        if vi.name in constant_inputs:
            st.consts[vi.name] = np.asarray(constant_inputs[vi.name], dtype=shape.dtype.np)
            continue
        st.graph_inputs.add(vi.name)
        inputs[vi.name] = shape
        st.ids[vi.name] = g.input(vi.name, shape)
        register_carriers(st, st.ids[vi.name], shape.dims)
    unknown = set(constant_inputs) - {vi.name for vi in m.graph.input}
    if unknown:
        raise OnnxImportError(f"constant_inputs names {sorted(unknown)}, not graph inputs")
    convert_nodes(st, m.graph.node)
    outs = [st.node_id(o.name) for o in m.graph.output]
    g.set_outputs(outs)
    g.verify()
    folded = {k: st.consts[k] for k in constant_inputs}
    return OnnxModel(
        module=GraphModule.from_graph(g),
        params=MappingProxyType(params),
        inputs=MappingProxyType(inputs),
        outputs=tuple(o.name for o in m.graph.output),
        opsets=MappingProxyType(opsets),
        constant_inputs=MappingProxyType(folded),
    )
