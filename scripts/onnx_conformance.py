"""The ONNX backend node-test report for rlx (and, optionally, ONNX Runtime on the same cases).

    python scripts/onnx_conformance.py                 # rlx on the CPU backend
    python scripts/onnx_conformance.py --engine reference
    python scripts/onnx_conformance.py --write-expected   # refresh the committed list
    /tmp/rlx/peers/bin/python scripts/onnx_conformance.py --peer ort   # + ORT's count

Prints pass / fail / unsupported by op type, each failure with its reason, each
unsupported op type with its case count, and the totals. A failure that passes at a
stated looser tolerance is marked so (16-bit cases: 2 ulp of the dtype, as their expected
data rounds after every op and rlx rounds once; other float cases: atol 1e-6, the
round-off their expected data carries). Those count as failures. ``--write-expected`` writes
tests/frontends/onnx/unsupported_node_cases.json (what the test suite checks against).

Then the wheel's model cases (``simple``, ``pytorch-operator``, ``pytorch-converted``):
each case's outcome (pass / fail with the reason / unsupported with what) and the counts per
kind; ``--write-expected`` also writes tests/frontends/onnx/model_cases.json."""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
EXPECTED = ROOT / "tests" / "frontends" / "onnx" / "unsupported_node_cases.json"
MODEL_EXPECTED = ROOT / "tests" / "frontends" / "onnx" / "model_cases.json"


def ort_outcome(case) -> str:  # noqa: ANN001
    """'pass' or 'fail: reason' for ONNX Runtime on one case (same comparison rule)."""
    import numpy as np
    import onnxruntime as ort

    from rlx.frontends.onnx.conformance import _arr, _compare

    try:
        opts = ort.SessionOptions()
        opts.log_severity_level = 4
        sess = ort.InferenceSession(
            case.model.SerializeToString(), opts, providers=["CPUExecutionProvider"]
        )
        names = [i.name for i in sess.get_inputs()]
        for ins, outs in case.data_sets:
            feeds = dict(zip(names, [_arr(v) for v in ins], strict=False))
            got = sess.run(None, feeds)
            for w, o in zip([_arr(v) for v in outs], got, strict=False):
                why = _compare(w, np.asarray(o), case.rtol, case.atol)
                if why:
                    return f"fail: {why}"
    except Exception as e:  # noqa: BLE001
        return f"fail: {type(e).__name__}: {str(e)[:120]}"
    return "pass"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--engine", choices=("cpu", "reference"), default="cpu")
    ap.add_argument("--peer", choices=("ort",), default=None, help="also run ONNX Runtime")
    ap.add_argument("--write-expected", action="store_true")
    ap.add_argument("--quiet", action="store_true", help="totals and failures only")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    from rlx.frontends.onnx.conformance import looser_tolerance, node_cases, run_case

    cases = node_cases()
    t0 = time.perf_counter()
    res = [run_case(c, args.engine) for c in cases]
    dt = time.perf_counter() - t0
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in res:
        by_op[r.op][r.status] += 1
    if not args.quiet:
        print(f"{'op type':32} {'pass':>5} {'fail':>5} {'unsup':>5}")
        for op in sorted(by_op):
            c = by_op[op]
            print(f"{op[:32]:32} {c['pass']:5} {c['fail']:5} {c['unsupported']:5}")
    fails = [r for r in res if r.status == "fail"]
    by_name = {c.name: c for c in cases}
    looser = {}
    for r in fails:
        case = by_name[r.name]
        tol, why = looser_tolerance(case)
        if run_case(case, args.engine, tol).status == "pass":
            looser[r.name] = {"rtol": tol[0], "atol": tol[1], "why": why}
    print(f"\nfailures ({len(fails)}; {len(looser)} of them pass at a stated looser tolerance):")
    for r in fails:
        lt = looser.get(r.name)
        note = f"  [passes at rtol {lt['rtol']:g}, atol {lt['atol']:g}: {lt['why']}]" if lt else ""
        print(f"  {r.name}: {r.reason}{note}")
    unsup = collections.Counter(r.unsupported for r in res if r.status == "unsupported")
    print(f"\nunsupported ({sum(unsup.values())} cases, {len(unsup)} reasons):")
    print("  " + ", ".join(f"{k} ({v})" for k, v in sorted(unsup.items())))
    folded = sum(1 for r in res if r.folded)
    tot = collections.Counter(r.status for r in res)
    print(
        f"\nrlx ({args.engine}): {tot['pass']} / {len(res)} pass, {tot['fail']} fail, "
        f"{tot['unsupported']} unsupported ({folded} passing or failing cases had shape "
        f"inputs folded at import); {dt:.1f} s"
    )
    if args.peer == "ort":
        import onnxruntime

        t0 = time.perf_counter()
        ort = [ort_outcome(c) for c in cases]
        n = sum(1 for o in ort if o == "pass")
        both = sum(1 for o, r in zip(ort, res, strict=True) if o == "pass" and r.status == "pass")
        print(
            f"onnxruntime {onnxruntime.__version__}: {n} / {len(res)} pass "
            f"({time.perf_counter() - t0:.1f} s); both pass {both}"
        )
    if args.write_expected:
        data = {
            "about": "node cases rlx names as unsupported (scripts/onnx_conformance.py "
            "--write-expected); every other case must pass",
            "unsupported_op_types": sorted(unsup),
            "cases": {r.name: r.unsupported for r in res if r.status == "unsupported"},
            "looser_tolerance": looser,
        }
        EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {EXPECTED}")
    model_report(args)
    return 0


def model_outcome(out) -> str:  # noqa: ANN001
    """'pass', 'unsupported: <what>' or 'fail: <reason>' (what model_cases.json records)."""
    if out.status == "unsupported":
        return f"unsupported: {out.unsupported}"
    return "pass" if out.status == "pass" else f"fail: {out.reason}"


def model_report(args: argparse.Namespace) -> None:
    """The simple / pytorch-operator / pytorch-converted cases: each outcome, the counts."""
    from rlx.frontends.onnx.conformance import model_cases, run_case

    cases = model_cases()
    res = {f"{c.kind}/{c.name}": model_outcome(run_case(c, args.engine)) for c in cases}
    print(f"\nmodel cases ({len(cases)}):")
    if not args.quiet:
        for k, v in res.items():
            print(f"  {k}: {v[:200]}")
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for k, v in res.items():
        counts[k.split("/")[0]][v.split(":")[0]] += 1
    for kind, c in counts.items():
        print(
            f"rlx ({args.engine}) {kind}: {c['pass']} pass, {c['fail']} fail, "
            f"{c['unsupported']} unsupported"
        )
    if args.peer == "ort":
        ort = collections.Counter()
        for c in cases:
            ort[(c.kind, ort_outcome(c) == "pass")] += 1
        for kind in counts:
            print(f"onnxruntime {kind}: {ort[(kind, True)]} / {sum(counts[kind].values())} pass")
    if args.write_expected:
        data = {
            "about": "outcome of each model case of the onnx wheel (scripts/onnx_conformance.py "
            "--write-expected): pass, or unsupported: <what rlx names>; fail never",
            "cases": res,
        }
        MODEL_EXPECTED.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {MODEL_EXPECTED}")


if __name__ == "__main__":
    sys.exit(main())
