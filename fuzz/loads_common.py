"""What the two fuzzers of ``rlx.ir.serialize.loads`` share (``fuzz/fuzz_loads.py``, the
atheris harness, and ``tests/ir/test_serialize_fuzz.py``, the seeded test): the file's
framing and running what loads.

In: a graph file's bytes (split into header text and blobs, framed again with the right
lengths and sha256), a header's JSON tree (the paths to its values), or a loaded graph and
its params. Out: bytes, paths, or whether the graph ran on the reference interpreter and on
the CPU backend; rlx errors are swallowed there, any other exception propagates (that is
what the fuzzers look for).

No atheris here: the test imports this module (putting ``fuzz/`` on ``sys.path``), the
harness inside its ``atheris.instrument_imports`` block.
"""

from __future__ import annotations

import hashlib
import struct
from typing import Any

import numpy as np

import rlx
from rlx.errors import RlxError
from rlx.ir.serialize import FORMAT_VERSION, MAGIC

__all__ = ["MAX_ELEMENTS", "MAX_ITERATIONS", "PRELUDE", "frame", "split", "json_paths", "run"]

PRELUDE = struct.Struct("<4sIQQ")  # magic, version, header length, blob length
MAX_ELEMENTS = 1 << 16  # a loaded graph with a larger tensor is not run
MAX_ITERATIONS = 1000  # nor one with a longer (or unbounded) while loop


# ---- framing ---------------------------------------------------------------------------


def frame(text: bytes, blobs: bytes) -> bytes:
    """A graph file of header ``text`` and ``blobs``, its lengths and checksum right."""
    body = PRELUDE.pack(MAGIC, FORMAT_VERSION, len(text), len(blobs)) + text + blobs
    return body + hashlib.sha256(body).digest()


def split(data: bytes) -> tuple[bytes, bytes]:
    """Header text and blobs of a framed file; the whole input as the header otherwise."""
    if len(data) >= PRELUDE.size + 32 and data[:4] == MAGIC:
        _, _, hl, bl = PRELUDE.unpack_from(data)
        if PRELUDE.size + hl + bl + 32 == len(data):
            start = PRELUDE.size
            return data[start : start + hl], data[start + hl : start + hl + bl]
    return data, b""


def json_paths(tree: Any, at: tuple = ()) -> list[tuple]:
    """Every path (keys / indices) to a node of the JSON tree, the root excluded."""
    if isinstance(tree, dict):
        items = list(tree.items())
    elif isinstance(tree, list):
        items = list(enumerate(tree))
    else:
        return []
    out = []
    for k, v in items:
        out.append((*at, k))
        out.extend(json_paths(v, (*at, k)))
    return out


# ---- running what loads ----------------------------------------------------------------


def _bounded(g: rlx.Graph) -> bool:
    """Whether running ``g`` must end soon: every while loop (in sub-graphs too) has a
    max_iterations of at most MAX_ITERATIONS (a loop without one may run forever, as its
    graph says)."""
    from rlx.ops.control import While

    for n in g.nodes:
        m = getattr(n.op, "max_iterations", 0)
        if isinstance(n.op, While) and (m is None or m > MAX_ITERATIONS):
            return False
        if not all(_bounded(sub) for sub in n.op.subgraphs()):
            return False
    return True


def _feeds(g: rlx.Graph, rng: np.random.Generator) -> dict[str, np.ndarray] | None:
    """Inputs for ``g`` (symbolic dims bound inside their bounds), or None when some tensor
    of the graph would exceed MAX_ELEMENTS."""
    bindings = {
        k: min(max(lo, 2), hi if hi is not None else 2) for k, (lo, hi) in g.sym_bounds.items()
    }
    for n in g.nodes:
        try:
            dims = n.shape.concrete(bindings)
        except RlxError:
            return None
        if int(np.prod(dims, dtype=object)) > MAX_ELEMENTS:
            return None
    feeds = {}
    for n in g.input_nodes():
        dims = n.shape.concrete(bindings)
        dt = n.shape.dtype
        if dt.is_float:
            a = rng.standard_normal(dims).astype(dt.np)
        elif dt.np == np.bool_:
            a = rng.integers(0, 2, dims).astype(bool)
        else:
            a = rng.integers(-3, 4, dims).astype(dt.np)
        feeds[n.op.name] = a
    return feeds


def run(
    g: rlx.Graph, params: dict[str, np.ndarray], rng: np.random.Generator, cpu: bool
) -> tuple[bool, bool] | None:
    """Run loaded graph ``g`` with random inputs from ``rng`` (params the file lacks are
    zeros) on the reference interpreter and, when ``cpu``, compiled on the CPU backend.
    Out: None when it is not run (a while loop without a small bound, or a tensor over
    MAX_ELEMENTS), else whether each of the two finished (an rlx error is an answer, not a
    finding); any other exception propagates."""
    feeds = _feeds(g, rng) if _bounded(g) else None
    if feeds is None:
        return None
    full = {n.op.name: params.get(n.op.name) for n in g.param_nodes()}
    for name, a in full.items():
        if a is None:
            shape = g.shape(next(n.id for n in g.param_nodes() if n.op.name == name))
            full[name] = np.zeros(shape.concrete({}), shape.dtype.np)
    ran = compiled = False
    with np.errstate(all="ignore"):
        try:
            g.evaluate(feeds, full)
            ran = True
        except RlxError:
            pass
        if cpu:
            try:
                rlx.Session("cpu").compile(g, params=full).run(feeds)
                compiled = True
            except RlxError:
                pass
    return ran, compiled
