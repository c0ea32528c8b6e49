"""The loader under fuzzing: thousands of mutations of a valid file's header (JSON values
replaced, swapped, deleted or spliced from elsewhere in the header; raw bytes flipped,
inserted or deleted; blob bytes changed), each re-framed so that its lengths and checksum
pass. Every mutant must either be refused with a SerializationError raised by an explicit
check (never the catch-all that wraps an unforeseen exception), or load into a graph that
verifies and then runs on the reference interpreter and the CPU backend raising nothing
but rlx errors. Seeded, so a failure reproduces; it prints the mutation that broke."""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlx
from rlx.errors import SerializationError
from rlx.ir.serialize import dumps, loads

# framing and running what loads, shared with the atheris harness fuzz/fuzz_loads.py
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "fuzz"))
from loads_common import frame, json_paths, run, split  # noqa: E402

N_MUTANTS = 3000


def _base() -> tuple[rlx.Graph, dict[str, np.ndarray]]:
    """A small graph touching many attribute kinds: symbolic dims with bounds, params,
    constants, enums, floats, bools, tuples of ints and of pairs, a sub-graph."""
    g = rlx.Graph("fuzz")
    b = g.sym("batch", min=1, max=4)
    x = g.input("x", (b, 8))
    w = g.param("w", (8, 8))
    h = g.add(g.matmul(x, w), g.constant(np.linspace(-1, 1, 8, dtype=np.float32)))
    h = g.layer_norm(h, g.constant(np.ones(8, np.float32)), eps=1e-5)
    s = g.softmax(h, axis=-1)
    t = g.transpose(g.reshape(s, (b, 2, 4)), (0, 2, 1))
    m = g.sum(t, axes=2)
    p = g.narrow(g.pad(m, [(0, 0), (1, 1)], value=0.5), 1, 1, 4)
    cs = g.cumsum(g.concat([p, m], axis=1), axis=1)
    picked = g.gather(cs, g.constant(np.array([3, 0], np.int32)), axis=1)
    big = g.where(g.lt(picked, 1.0), picked, g.neg(picked))
    flag = g.constant(np.array(True))
    branch = g.cond(flag, lambda sg, a: sg.exp(a), lambda sg, a: sg.neg(a), [m])
    g.set_outputs([g.cast(big, "f16"), branch, g.argmax(s, axis=-1)])
    g.verify()
    params = {"w": np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)}
    return g, params


# ---- mutations -------------------------------------------------------------------------

_WORDS = [
    "", "x", "w", "batch", "f32", "f16", "i8", "bool", "input", "param", "matmul", "tuple",
    "float", "graph", "const", "sym", "enum", "dataclass", "ADD", "EXP", "MaxAbs", "DType",
    "BinaryKind", "ConstValue", "Shape", "Sym", "Graph", "0x1p+0", "nan", "-inf", "1 b",
]  # fmt: skip
_NUMBERS = [0, 1, -1, 2, 3, 7, 8, 9, 64, 255, -(2**31), 2**31, 2**62, 2**63, 2**64, 10**30]


def _get(tree: Any, path: tuple) -> Any:
    for k in path:
        tree = tree[k]
    return tree


def _new_value(rng: random.Random, old: Any, donors: list[Any]) -> Any:
    choice = rng.randrange(8)
    if choice == 0 and type(old) is int:
        return old + rng.choice([-2, -1, 1, 2])
    if choice == 1:
        return rng.choice(_NUMBERS)
    if choice == 2:
        return rng.choice(_WORDS)
    if choice == 3:
        return rng.choice([None, True, False, [], {}, 0.5, -0.0, [1, 2], {"tuple": []}])
    if choice == 4 and isinstance(old, bool):
        return not old
    if choice == 5:
        return {"float": rng.choice(["0x1p+0", "-0x0p+0", "nan", "inf", "0x1p-1074", "zz"])}
    return rng.choice(donors)  # splice: a value from elsewhere in the file


def _mutate_json(
    rng: random.Random, header: dict, text: bytes, paths: list[tuple]
) -> tuple[str, dict]:
    """One mutation of a fresh copy of ``header`` (parsed from ``text``; its node paths are
    ``paths``). Values spliced in from ``header`` are shared, not copied: nothing mutates
    them afterwards."""
    h = json.loads(text)
    path = rng.choice(paths)
    parent, key = _get(h, path[:-1]), path[-1]
    old = parent[key]
    op = rng.randrange(10)
    if op == 0 and isinstance(parent, dict):
        del parent[key]
        return f"delete {path}", h
    if op == 1 and isinstance(parent, list):
        parent.insert(key, old)
        return f"duplicate {path}", h
    if op == 2 and isinstance(parent, dict):
        new_key = rng.choice(_WORDS)
        parent[new_key] = parent.pop(key)
        return f"rename {path} -> {new_key!r}", h
    donors = [_get(header, p) for p in rng.sample(paths, min(len(paths), 8))]
    new = _new_value(rng, old, donors)
    parent[key] = new
    return f"set {path}: {old!r} -> {new!r}"[:300], h


def _mutate_bytes(rng: random.Random, text: bytes) -> tuple[str, bytes]:
    b = bytearray(text)
    pos = rng.randrange(len(b))
    op = rng.randrange(3)
    if op == 0:
        new = rng.choice(b'0123456789-,:[]{}"ntfe. ')
        what = f"header byte {pos}: {bytes([b[pos]])!r} -> {bytes([new])!r}"
        b[pos] = new
    elif op == 1:
        what = f"header byte {pos} deleted"
        del b[pos]
    else:
        new = rng.choice(b'019-"[{,')
        what = f"byte {bytes([new])!r} inserted at header byte {pos}"
        b.insert(pos, new)
    return what, bytes(b)


def _mutate_blobs(rng: random.Random, blobs: bytes) -> tuple[str, bytes]:
    b = bytearray(blobs)
    pos = rng.randrange(len(b))
    b[pos] ^= rng.randrange(1, 256)
    return f"blob byte {pos} changed", bytes(b)


@dataclass
class Stats:
    refused: int = 0
    loaded: int = 0
    ran: int = 0
    too_big: int = 0
    compiled: int = 0
    failures: list[str] = field(default_factory=list)


def fuzz(n: int, seed: int, cpu_every: int = 1) -> Stats:
    """Run ``n`` mutants of the base file; collect every failure (see the module doc)."""
    rng = random.Random(seed)
    nprng = np.random.default_rng(seed)
    good = dumps(*_base())
    text, blobs = split(good)
    header = json.loads(text)
    paths = json_paths(header)
    stats = Stats()
    seen: set[str] = set()
    mutators: list[Callable[[], tuple[str, bytes]]] = [
        lambda: (lambda w, h: (w, frame(json.dumps(h).encode(), blobs)))(
            *_mutate_json(rng, header, text, paths)
        ),
        lambda: (lambda w, t: (w, frame(t, blobs)))(*_mutate_bytes(rng, text)),
        lambda: (lambda w, b: (w, frame(text, b)))(*_mutate_blobs(rng, blobs)),
    ]
    for k in range(n):
        what, data = rng.choices(mutators, weights=[8, 3, 1 if blobs else 0])[0]()
        try:
            g, params = loads(data)
        except SerializationError as e:
            stats.refused += 1
            if e.__cause__ is not None:
                stats.failures.append(f"#{k} {what}: caught only by the catch-all: {e}")
            continue
        except Exception as e:  # noqa: BLE001 - what the test is looking for
            stats.failures.append(f"#{k} {what}: loads raised {type(e).__name__}: {e}")
            continue
        stats.loaded += 1
        fp = g.fingerprint()
        cpu = fp not in seen and stats.loaded % cpu_every == 0
        try:
            outcome = run(g, params, nprng, cpu)
        except Exception as e:  # noqa: BLE001
            stats.failures.append(f"#{k} {what}: running raised {type(e).__name__}: {e}")
            outcome = (False, False)
        if outcome is None:
            stats.too_big += 1
        else:
            stats.ran += outcome[0]
            stats.compiled += outcome[1]
        seen.add(fp)
    return stats


@pytest.mark.slow
def test_header_mutations_are_refused_or_load_into_graphs_that_run():
    stats = fuzz(N_MUTANTS, seed=19)
    assert not stats.failures, "\n".join(stats.failures[:20])
    assert stats.refused + stats.loaded == N_MUTANTS
    # the campaign exercises both outcomes (mutations that keep a file valid, e.g. a new
    # constant value or a source line, and ones that do not)
    assert stats.loaded > 100 and stats.refused > N_MUTANTS // 2, stats
    assert stats.ran > 50 and stats.compiled > 10, stats


if __name__ == "__main__":  # pragma: no cover - python tests/ir/test_serialize_fuzz.py [n]
    import sys
    import time

    t0 = time.perf_counter()
    s = fuzz(
        int(sys.argv[1]) if len(sys.argv) > 1 else N_MUTANTS,
        seed=int(sys.argv[2]) if len(sys.argv) > 2 else 19,
    )
    print(f"{time.perf_counter() - t0:.1f}s", {k: v for k, v in vars(s).items() if k != "failures"})
    print("\n".join(s.failures[:60]))
    print(len(s.failures), "failures")
