"""The 36 f32 GEMMs of one 1x16 all-MiniLM-L6-v2 forward on rlx's sgemm builds, in one process.

    python benchmarks/skinny_forward.py [SO ...] [--m 16] [--rounds 60] [--hot]

Per layer (6): q, k, v, o 16x384x384 + bias, up 16x1536x384 + bias + erf GELU, down
16x384x1536 + bias, each with its own random weight (42.5 MB of packed f32 in all, more
than a 32 MB L3: every forward streams them from DRAM, as the real model does). ``--hot``:
one layer's weights only (7 MB, from L3). Libraries: this tree's sgemm (built for the
selected target, ``RLX_ISA``) and each given ``sgemm-*.so`` (another tree's build: the
before / after of a kernel change; same target). Rounds visit every library in turn; each
GEMM call is timed on its own. Reported per library: the sum over the 36 GEMMs of each
one's fastest call (on a shared machine the least disturbed estimate of one forward's
GEMM time), the same with each one's 25th percentile, and the fastest whole pass; and
that every library's outputs are bit-identical to the first one built for the same target.
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rlx.backends.cpu.native.sgemm import SgemmLib, sgemm_lib  # noqa: E402

SHAPES = [(384, 384, None)] * 4 + [(1536, 384, "gelu"), (384, 1536, None)]  # (N, K, act)


def load(path: str, tmp: Path, i: int) -> SgemmLib:
    """An sgemm library from a .so file (copied first: one loaded instance per path)."""
    ctypes.CDLL("libmvec.so.1", mode=ctypes.RTLD_GLOBAL)  # the epilogue's vector erf / exp
    dst = tmp / f"lib{i}.so"
    shutil.copy(path, dst)
    lib = ctypes.CDLL(str(dst))
    ref = sgemm_lib().lib
    for name in ("rlx_sgemm", "rlx_sgemm_pack_b", "rlx_sgemm_packed_size"):
        fn, rf = getattr(lib, name), getattr(ref, name)
        fn.argtypes, fn.restype = rf.argtypes, rf.restype
    lib.rlx_sgemm_set_blocking.argtypes = [ctypes.c_long] * 3
    for name in ("rlx_sgemm_level", "rlx_sgemm_mr", "rlx_sgemm_nr", "rlx_sgemm_openmp"):
        getattr(lib, name).restype = ctypes.c_int
    return SgemmLib(lib)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("libs", nargs="*", help="other sgemm-*.so builds to compare")
    ap.add_argument("--m", type=int, default=16, help="rows (tokens)")
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--hot", action="store_true", help="one layer's weights (from L3)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="rlx_skinny_") as tmp:
        libs = {"this tree": sgemm_lib()}
        for i, p in enumerate(args.libs):
            libs[Path(p).name] = load(p, Path(tmp), i)
        rng = np.random.default_rng(0)
        weights = [
            (rng.standard_normal((k, n), dtype=np.float32), rng.standard_normal(n, np.float32), act)
            for _ in range(1 if args.hot else 6)
            for n, k, act in SHAPES
        ]
        a_of = {k: rng.standard_normal((args.m, k), dtype=np.float32) for k in (384, 1536)}
        runs = {}
        for name, lib in libs.items():
            calls, outs = [], []
            for b, bias, act in weights:
                k, n = b.shape
                p, c = lib.pack_b(b), np.empty((args.m, n), np.float32)
                calls.append(lib.gemm_args(a_of[k], p, c, bias=bias, act=act))
                outs.append((p, c))
            runs[name] = (lib, calls, outs, [[] for _ in range(len(calls) + 1)])
        for _ in range(args.rounds):
            for lib, calls, _, ts in runs.values():
                f = lib.lib.rlx_sgemm
                t00 = time.perf_counter()
                for j, call in enumerate(calls):
                    t0 = time.perf_counter()
                    f(*call, 1)
                    ts[j].append(time.perf_counter() - t0)
                ts[-1].append(time.perf_counter() - t00)
        flop = sum(2 * args.m * b.shape[0] * b.shape[1] for b, _, _ in weights)
        first: dict[str, list] = {}
        print(f"M = {args.m}, {len(weights)} GEMMs, {flop / 1e6:.0f} MFLOP, rounds {args.rounds}")
        for name, (lib, _, outs, ts) in runs.items():
            best = sum(min(t) for t in ts[:-1])
            p25 = sum(sorted(t)[len(t) // 4] for t in ts[:-1])
            same = "-"
            if lib.isa in first:
                same = str(all(np.array_equal(x[1], y[1]) for x, y in zip(first[lib.isa], outs)))
            else:
                first[lib.isa] = outs
            print(
                f"{name} ({lib.isa}): sum of per-call minima {best * 1e3:.3f} ms "
                f"({flop / best / 1e9:.0f} GFLOP/s), p25 {p25 * 1e3:.3f} ms, fastest pass "
                f"{min(ts[-1]) * 1e3:.3f} ms, bits equal to the first {lib.isa} build: {same}"
            )


if __name__ == "__main__":
    main()
