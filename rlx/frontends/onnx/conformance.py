"""The ONNX backend conformance suite through rlx. In: the node test cases that the
installed onnx generates (``onnx.backend.test.loader.load_node_model_tests()``). Out: one
:class:`Outcome` per case: ``pass``, ``fail`` (with the reason) or ``unsupported`` (an
OnnxUnsupportedError at import: an op, dtype or form rlx does not import, named).

A case runs as a user would run it: ``load`` (inputs that carry shapes, such as a Reshape's
shape, are folded as constants when the importer asks for them: rlx compiles static
shapes), compile for the CPU (or evaluate with the reference interpreter), run each data
set and compare with onnx's own rule: equal dtypes, then ``assert_allclose`` with the
case's rtol / atol (1e-3 / 1e-7 unless the case says otherwise)."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from onnx import GraphProto, ModelProto, TensorProto, numpy_helper

from rlx.frontends.onnx.errors import NeedsConstantError, OnnxUnsupportedError
from rlx.frontends.onnx.loader import load

__all__ = ["Outcome", "node_cases", "op_types", "run_case", "primary_op"]


@dataclass(frozen=True)
class Outcome:
    """What became of one case: ``status`` is pass / fail / unsupported."""

    name: str
    op: str
    status: str
    reason: str = ""
    folded: tuple[str, ...] = ()
    unsupported: str = ""  # what rlx does not import: an op type, 'dtype:X', 'opset', ...


def node_cases() -> list[Any]:
    """The onnx node test cases (in memory), sorted by name."""
    from onnx.backend.test.loader import load_node_model_tests

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(load_node_model_tests(), key=lambda c: c.name)


def _walk(g: GraphProto) -> Iterator[str]:
    for n in g.node:
        yield n.op_type
        for a in n.attribute:
            if a.g.node:
                yield from _walk(a.g)
            for sub in a.graphs:
                yield from _walk(sub)


def op_types(m: ModelProto) -> set[str]:
    """Every op type in ``m``, sub-graphs included."""
    return set(_walk(m.graph))


def primary_op(case: Any) -> str:
    """The op a case tests: its single op type, else the one its name starts with."""
    ops = op_types(case.model)
    if len(ops) == 1:
        return next(iter(ops))
    stem = case.name.removeprefix("test_").replace("_", "").lower()
    best = max((o for o in ops if stem.startswith(o.lower())), key=len, default=None)
    return best or ",".join(sorted(ops))


def _compare(want: Any, got: np.ndarray, rtol: float, atol: float) -> str | None:
    if isinstance(want, np.generic):
        want = np.asarray(want)
    if not isinstance(want, np.ndarray):
        return f"expected a {type(want).__name__} output (sequence/optional), got a tensor"
    if want.dtype == object:
        return None if np.array_equal(want, got) else "object outputs differ"
    if want.dtype != got.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if want.shape != got.shape:
        return f"shape {got.shape}, expected {want.shape}"
    try:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
    except AssertionError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return " ".join(lines[1:4])[:300]
    return None


def _arr(v: Any) -> Any:
    if isinstance(v, TensorProto):
        return numpy_helper.to_array(v)
    return v


def looser_tolerance(case: Any) -> tuple[tuple[float, float], str]:
    """((rtol, atol), why) to re-check a failing case at: two units in the last place for
    16-bit float outputs (expected data rounded after every NumPy op; rlx rounds once),
    else atol 1e-6 (expected data computed in float32 carries round-off of that size)."""
    eps = 0.0
    for o in case.model.graph.output:
        t = o.type.tensor_type.elem_type
        eps = max(eps, {TensorProto.BFLOAT16: 2.0**-8, TensorProto.FLOAT16: 2.0**-11}.get(t, 0))
    if eps:
        return (4 * eps, 4 * eps), "2 ulp of the 16-bit output type"
    return (case.rtol, 1e-6), "float32 round-off in the expected data"


def run_case(
    case: Any, engine: str = "cpu", tolerance: tuple[float, float] | None = None
) -> Outcome:
    """Import, compile (``engine`` 'cpu', or 'reference' for the NumPy interpreter), run
    and compare one case (with ``tolerance`` (rtol, atol) instead of the case's own)."""
    rtol, atol = tolerance or (case.rtol, case.atol)
    op = primary_op(case)
    folded: dict[str, np.ndarray] = {}
    inits = {t.name for t in case.model.graph.initializer}
    in_names = [i.name for i in case.model.graph.input if i.name not in inits]
    first_inputs = [_arr(v) for v in case.data_sets[0][0]] if case.data_sets else []
    try:
        for _ in range(len(in_names) + 1):
            try:
                model = load(case.model, constant_inputs=folded)
                break
            except NeedsConstantError as e:
                if e.input_name in folded or e.input_name not in in_names:
                    raise
                folded[e.input_name] = first_inputs[in_names.index(e.input_name)]
    except OnnxUnsupportedError as e:
        what = f"{e.domain}::{e.op_type}" if e.domain else e.op_type
        return Outcome(case.name, op, "unsupported", str(e), unsupported=what or "?")
    except Exception as e:  # noqa: BLE001 - a failure is reported, not raised
        return Outcome(case.name, op, "fail", f"import: {type(e).__name__}: {e}"[:400])
    fold = tuple(sorted(folded))
    try:
        if engine == "cpu":
            compiled = model.compile()
            run = compiled.run
        else:
            graph, params = model.graph, dict(model.params)

            def run(feeds: dict) -> list:  # noqa: E306
                return graph.evaluate(feeds, params)

        for ins, outs in case.data_sets:
            ins, outs = [_arr(v) for v in ins], [_arr(v) for v in outs]
            feeds = model.feeds(dict(zip(in_names, ins, strict=False)))
            got = run(feeds)
            if len(got) != len(outs):
                return Outcome(
                    case.name, op, "fail", f"{len(got)} outputs, expected {len(outs)}", fold
                )
            for i, (w, o) in enumerate(zip(outs, got, strict=True)):
                why = _compare(w, np.asarray(o), rtol, atol)
                if why:
                    return Outcome(case.name, op, "fail", f"output {i}: {why}", fold)
    except Exception as e:  # noqa: BLE001
        return Outcome(case.name, op, "fail", f"{engine}: {type(e).__name__}: {e}"[:400], fold)
    return Outcome(case.name, op, "pass", "", fold)


#: The model test directories the onnx wheel ships besides the node cases.
MODEL_KINDS = ("simple", "pytorch-operator", "pytorch-converted")


@dataclass(frozen=True)
class ModelCase:
    """One of the wheel's model test cases, read from its directory: the ``model``, its
    ``data_sets`` ((inputs, outputs) per test_data_set_*), ``rtol`` / ``atol`` and ``kind``."""

    name: str
    kind: str
    model: ModelProto
    data_sets: tuple[tuple[list[Any], list[Any]], ...]
    rtol: float
    atol: float


def _read_value(path: Any, vi: Any) -> Any:
    """A test_data_set_* file as onnx's runner reads it: by the graph value's type."""
    import onnx
    from onnx import numpy_helper

    data = path.read_bytes()
    which = vi.type.WhichOneof("value") if vi is not None else "tensor_type"
    if which == "sequence_type":
        p = onnx.SequenceProto()
        p.ParseFromString(data)
        return numpy_helper.to_list(p)
    if which == "optional_type":
        p = onnx.OptionalProto()
        p.ParseFromString(data)
        return numpy_helper.to_optional(p)
    t = TensorProto()
    t.ParseFromString(data)
    return t


def model_cases(kinds: tuple[str, ...] = MODEL_KINDS) -> list[ModelCase]:
    """The wheel's ``simple`` / ``pytorch-operator`` / ``pytorch-converted`` cases with
    their data sets, sorted by (kind, name)."""
    from pathlib import Path

    import onnx
    from onnx.backend.test.loader import load_model_tests

    out = []
    for kind in kinds:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tests = load_model_tests(kind=kind)
        for t in tests:
            assert t.model_dir is not None  # node tests live in a directory
            d = Path(t.model_dir)
            model = onnx.load(str(d / "model.onnx"))
            inits = {i.name for i in model.graph.initializer}
            ins = [i for i in model.graph.input if i.name not in inits]
            sets = []
            for ds in sorted(d.glob("test_data_set_*")):
                n_in = len(list(ds.glob("input_*.pb")))
                n_out = len(list(ds.glob("output_*.pb")))
                xs = [
                    _read_value(ds / f"input_{i}.pb", ins[i] if i < len(ins) else None)
                    for i in range(n_in)
                ]
                outs = model.graph.output
                ys = [
                    _read_value(ds / f"output_{i}.pb", outs[i] if i < len(outs) else None)
                    for i in range(n_out)
                ]
                sets.append((xs, ys))
            out.append(ModelCase(t.name, kind, model, tuple(sets), t.rtol, t.atol))
    return sorted(out, key=lambda c: (c.kind, c.name))
