"""Single convolutions of ResNet-18 / MobileNetV2 (issue 31): rlx vs ONNX Runtime on the
same one-node ONNX file (Conv + Relu, random weights, batch 1), CPU time per call.

rlx runs each conv twice: as compiled (``auto``: Winograd / the direct conv on NCHWc blocks
/ the pointwise 1x1 kernel where they apply) and with those off (``gemm``: the
packed-sgemm / depthwise paths they replace).
Both engines run in this process, alternating call by call (CPU time,
``time.process_time``, so a loaded machine inflates both alike); the figure is the
minimum over ``--calls`` calls. GFLOP/s = 2 x multiply-adds / time, and % of the f32
FMA peak measured in the same run by rlx's probe (``native/peak.py``, best of 40 tries,
the selected target's vector width).

    .venv/bin/python benchmarks/conv_layers.py [--calls 15] [--threads 1] [--only 3x3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from pathlib import Path

import _common  # noqa: F401  (puts the repository on sys.path; import before NumPy)
import numpy as np

# (label, c, o, hw, k, stride, groups)
LAYERS = [
    ("7x7/2 3->64 @224 (stem)", 3, 64, 224, 7, 2, 1),
    ("3x3 64->64 @56", 64, 64, 56, 3, 1, 1),
    ("3x3/2 64->128 @56", 64, 128, 56, 3, 2, 1),
    ("3x3 128->128 @28", 128, 128, 28, 3, 1, 1),
    ("3x3/2 128->256 @28", 128, 256, 28, 3, 2, 1),
    ("3x3 256->256 @14", 256, 256, 14, 3, 1, 1),
    ("3x3/2 256->512 @14", 256, 512, 14, 3, 2, 1),
    ("3x3 512->512 @7", 512, 512, 7, 3, 1, 1),
    ("1x1/2 256->512 @14", 256, 512, 14, 1, 2, 1),
    ("3x3/2 3->32 @224 (mbv2 stem)", 3, 32, 224, 3, 2, 1),
    ("depthwise 3x3 32 @112", 32, 32, 112, 3, 1, 32),
    ("depthwise 3x3/2 96 @112", 96, 96, 112, 3, 2, 96),
    ("depthwise 3x3 144 @56", 144, 144, 56, 3, 1, 144),
    ("depthwise 3x3/2 576 @14", 576, 576, 14, 3, 2, 576),
    ("depthwise 3x3 960 @7", 960, 960, 7, 3, 1, 960),
    ("1x1 16->96 @112", 16, 96, 112, 1, 1, 1),
    ("1x1 24->144 @56", 24, 144, 56, 1, 1, 1),
    ("1x1 144->24 @56", 144, 24, 56, 1, 1, 1),
    ("1x1 320->1280 @7", 320, 1280, 7, 1, 1, 1),
]


def _model(path: Path, c: int, o: int, hw: int, k: int, s: int, g: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((o, c // g, k, k)) / np.sqrt(c // g * k * k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    oh = (hw + 2 * (k // 2) - k) // s + 1
    conv = helper.make_node(
        "Conv", ["x", "w", "b"], ["y0"], kernel_shape=[k, k], strides=[s, s],
        pads=[k // 2] * 4, group=g,
    )  # fmt: skip
    relu = helper.make_node("Relu", ["y0"], ["y"])
    graph = helper.make_graph(
        [conv, relu],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, o, oh, oh])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=15)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--only", default="", help="run the layers whose label contains this")
    a = ap.parse_args()
    import onnxruntime as ort

    import rlx
    from rlx.backends.cpu.engines import conv_nchwc
    from rlx.backends.cpu.native.peak import measure_peak

    # best of 40 short tries (a loaded machine only lowers a try)
    peak = measure_peak(a.threads, seconds=0.4, tries=40).gflops
    load0 = os.getloadavg()
    print(f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC, load {load0[0]:.1f}, "
          f"RLX_ISA={os.environ.get('RLX_ISA', 'auto')}, {a.threads} thread(s), "
          f"FMA peak {peak:.1f} GFLOP/s")  # fmt: skip
    print("\n| conv | ORT ms | rlx ms | rlx / ORT | rlx GFLOP/s | % peak | ORT % peak "
          "| rlx (new paths off) ms | path |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    so = ort.SessionOptions()
    so.intra_op_num_threads = a.threads
    with tempfile.TemporaryDirectory() as tmp:
        for label, c, o, hw, k, s, g in LAYERS:
            if a.only not in label:
                continue
            path = Path(tmp) / "conv.onnx"
            _model(path, c, o, hw, k, s, g)
            x = np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32)
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            runs = {"ort": lambda sess=sess, x=x: sess.run(None, {"x": x})}
            notes = ""
            for name, on in (("auto", True), ("gemm", False)):
                conv_nchwc.ENABLED = conv_nchwc.POINTWISE = on
                m = rlx.onnx.load(str(path))
                cg = m.compile(num_threads=a.threads, use_cache=False)  # the switches differ
                if on:
                    text = str(cg.report())
                    paths = ("Winograd", "depthwise conv on NCHWc", "NCHWc", "pointwise",
                             "depthwise", "sgemm")  # fmt: skip
                    notes = next((w for w in paths if w in text), "other")
                runs[name] = lambda cg=cg, x=x: cg.run({"x": x})
            conv_nchwc.ENABLED = conv_nchwc.POINTWISE = True
            best = dict.fromkeys(runs, float("inf"))
            for _ in range(a.calls):
                for name, fn in runs.items():
                    t = time.process_time()
                    fn()
                    best[name] = min(best[name], time.process_time() - t)
            oh = (hw + 2 * (k // 2) - k) // s + 1
            flops = 2 * o * oh * oh * (c // g) * k * k
            r, t_ort = best["auto"], best["ort"]
            print(f"| {label} | {t_ort * 1e3:.3f} | {r * 1e3:.3f} | {r / t_ort:.2f} | "
                  f"{flops / r / 1e9:.1f} | {100 * flops / r / 1e9 / peak:.0f} | "
                  f"{100 * flops / t_ort / 1e9 / peak:.0f} | {best['gemm'] * 1e3:.3f} | "
                  f"{notes} |")  # fmt: skip
    print(f"\nload after: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
