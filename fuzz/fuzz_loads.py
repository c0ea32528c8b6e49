"""Coverage-guided fuzzing of ``rlx.ir.serialize.loads`` with atheris (libFuzzer for
Python).

In: byte strings from libFuzzer. Out: nothing, or a crash report (and the input that
caused it, saved by libFuzzer as ``crash-<sha1>``) when ``loads``

* raises anything but SerializationError,
* raises a SerializationError that only the loader's catch-all produced (one that carries
  a ``__cause__``: an exception no explicit check foresaw), or
* returns a graph that then fails to verify, or raises a non-rlx exception when it runs on
  the reference interpreter (and, with ``--cpu``, on the CPU backend).

A random byte string would never get past the file's checksum, so the harness mutates
*structurally*: its custom mutator splits a framed file into header and blobs; then either
replaces, deletes, duplicates or splices one JSON value of the header, or lets libFuzzer
mutate the header's text (now and then a blob, or the raw file with its framing); and
frames the result again with the right lengths and sha256. Coverage then guides the
mutations into the decoder, the type checks, the verifier and the ops' shape rules.

Run it (atheris is an optional extra, not a dependency of rlx)::

    pip install -e '.[fuzz]'            # or: pip install atheris
    python fuzz/fuzz_loads.py fuzz/corpus -max_total_time=600
    python fuzz/fuzz_loads.py --cpu fuzz/corpus -max_total_time=600   # also compile + run
    python fuzz/fuzz_loads.py crash-<sha1>                             # replay one input

An empty (or missing) corpus directory is seeded with a few valid files. Everything after
the harness's own options goes to libFuzzer (``-runs=N``, ``-jobs=N``, ``-dict=...``).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import sys

import atheris

with atheris.instrument_imports(include=["rlx"]):
    import numpy as np

    # framing and running what loads, shared with tests/ir/test_serialize_fuzz.py (this
    # script's folder is on sys.path; the rlx it imports is instrumented too, in this block)
    from loads_common import PRELUDE, frame, json_paths, run, split

    import rlx
    import rlx.backends.reference  # noqa: F401  (imported here to be instrumented)
    import rlx.ir.verify  # noqa: F401
    import rlx.runtime.session  # noqa: F401
    from rlx.errors import SerializationError
    from rlx.ir.serialize import dumps, loads

RUN_CPU = False


# ---- seeds ---------------------------------------------------------------------------


def _seed_graphs() -> list[bytes]:
    """A few valid files covering many attribute kinds (locations left out)."""
    out = []
    g = rlx.Graph("seed_mlp")
    b = g.sym("batch", min=1, max=4)
    x = g.input("x", (b, 8))
    w = g.param("w", (8, 8))
    h = g.add(g.matmul(x, w), g.constant(np.linspace(-1, 1, 8, dtype=np.float32)))
    h = g.layer_norm(h, g.constant(np.ones(8, np.float32)))
    s = g.softmax(h, axis=-1)
    t = g.transpose(g.reshape(s, (b, 2, 4)), (0, 2, 1))
    g.set_outputs([g.cast(t, "f16"), g.argmax(s, axis=-1)])
    out.append(dumps(g, {"w": np.eye(8, dtype=np.float32)}, locations=False))

    g = rlx.Graph("seed_control")
    x = g.input("x", (4,))
    c = g.cond(g.constant(np.array(True)), lambda s, a: s.exp(a), lambda s, a: s.neg(a), [x])
    loop = g.while_loop(
        lambda s, i, a: s.lt(i, s.constant(np.float32(3))),
        lambda s, i, a: [s.add(i, 1.0), s.mul(a, 0.5)],
        [g.constant(np.float32(0)), c],
        output_index=1,
        max_iterations=10,
    )
    g.set_outputs([loop])
    out.append(dumps(g, locations=False))

    g = rlx.Graph("seed_movement")
    x = g.input("x", (2, 3, 4), "i32")
    y = g.narrow(g.pad(g.concat([x, x], axis=1), [(0, 0), (1, 1), (0, 0)]), 1, 1, 4)
    y = g.cumsum(g.sum(g.cast(y, "f32"), axes=0), axis=1)
    idx = g.gather(x, g.constant(np.array([1, 0], np.int32)), axis=2)
    g.set_outputs([g.where(g.lt(y, 1.0), y, g.neg(y)), idx])
    out.append(dumps(g, locations=False))
    return out


def _write_seeds(corpus: str) -> None:
    os.makedirs(corpus, exist_ok=True)
    if os.listdir(corpus):
        return
    for data in _seed_graphs():
        name = hashlib.sha1(data).hexdigest()
        with open(os.path.join(corpus, name), "wb") as f:
            f.write(data)


# ---- the structure-aware mutator ---------------------------------------------------


_WORDS = [
    "", "x", "batch", "f32", "f16", "i32", "bool", "input", "param", "constant", "matmul",
    "tuple", "float", "graph", "const", "sym", "coeff", "enum", "member", "dataclass",
    "fields", "ADD", "EXP", "DType", "BinaryKind", "ConstValue", "Shape", "Sym", "nan",
]  # fmt: skip
_VALUES = [0, 1, -1, 2, 3, 8, 2**31, 2**63, 10**30, None, True, False, [], {}, 0.5, -0.0]


def _mutate_json(text: bytes, rng: random.Random) -> bytes | None:
    """Replace, delete, duplicate or splice one value of the header; None when the text
    is not a JSON object."""
    try:
        header = json.loads(text)
    except ValueError:
        return None
    paths = json_paths(header)
    if not isinstance(header, dict) or not paths:
        return None
    path = rng.choice(paths)
    parent = header
    for k in path[:-1]:
        parent = parent[k]
    key, roll = path[-1], rng.random()
    if roll < 0.1 and isinstance(parent, dict):
        del parent[key]
    elif roll < 0.2 and isinstance(parent, list):
        parent.insert(key, parent[key])
    elif roll < 0.3 and isinstance(parent, dict):
        parent[rng.choice(_WORDS)] = parent.pop(key)
    else:
        donor = json.loads(text)
        for k in rng.choice(paths):
            donor = donor[k]
        pool = [donor, rng.choice(_WORDS), rng.choice(_VALUES)]
        old = parent[key]
        if type(old) is int:
            pool.append(old + rng.choice([-1, 1]))
        parent[key] = rng.choice(pool)
    return json.dumps(header).encode()


def custom_mutator(data: bytes, max_size: int, seed: int) -> bytes:
    rng = random.Random(seed)
    roll = rng.random()
    if roll < 0.05:  # the framing too: prelude, lengths, checksum, trailing bytes
        return atheris.Mutate(data, max_size)
    text, blobs = split(data)
    room = max_size - PRELUDE.size - 32  # what header and blobs may take
    mutated = _mutate_json(text, rng) if roll < 0.5 else None
    if mutated is not None:  # structure-aware: one JSON value
        text = mutated
    elif roll < 0.6 and blobs:
        blobs = atheris.Mutate(blobs, len(blobs))
    else:  # libFuzzer's byte-level mutations of the header text
        text = atheris.Mutate(text, max(room - len(blobs), 0))
    out = frame(text, blobs)
    return out if len(out) <= max_size else out[:max_size]


# ---- the property --------------------------------------------------------------------


def TestOneInput(data: bytes) -> None:  # noqa: N802 - the name atheris looks for
    try:
        g, params = loads(data)
    except SerializationError as e:
        if e.__cause__ is not None:
            raise AssertionError(f"refused only by the catch-all: {e}") from e.__cause__
        return
    g.verify()
    run(g, params, np.random.default_rng(0), RUN_CPU)


def main(argv: list[str]) -> None:
    global RUN_CPU
    if "--cpu" in argv:
        RUN_CPU = True
        argv = [a for a in argv if a != "--cpu"]
    dirs = [a for a in argv[1:] if not a.startswith("-") and not os.path.isfile(a)]
    for d in dirs[:1]:
        _write_seeds(d)
    if not any(a.startswith("-max_len=") for a in argv):
        argv = [*argv, "-max_len=65536"]  # the seeds are a few KB; leave room to grow
    if not any(a.startswith("-timeout=") for a in argv):
        argv = [*argv, "-timeout=30"]  # an input slower than this is saved as a finding
    atheris.Setup(argv, TestOneInput, custom_mutator=custom_mutator)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
