"""Export the real-model ONNX files (MLP, small CNN, random-weight BERT encoder, the real
all-MiniLM-L6-v2) with both PyTorch exporters into a directory (not committed).

    python scripts/onnx_export_models.py OUT_DIR [--models mlp,cnn] [--exporters dynamo]

The models and the export live in tests/frontends/onnx/torch_models.py
(``export_model(name, exporter, out_dir) -> Path``, ``export_all(out_dir)``); this script is
their command line. Needs the ``oracles`` extra (torch, onnxscript, transformers)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.frontends.onnx.torch_models import (  # noqa: E402
    EXPORTERS,
    NAMES,
    build,
    export_all,
    export_model,
)

__all__ = ["export_model", "export_all", "NAMES", "EXPORTERS"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--models", default=",".join(NAMES))
    ap.add_argument("--exporters", default=",".join(EXPORTERS))
    a = ap.parse_args(argv)
    for name in a.models.split(","):
        model = build(name)
        for exporter in a.exporters.split(","):
            t = time.perf_counter()
            path = export_model(name, exporter, a.out_dir, model=model)
            kb = path.stat().st_size / 1024
            print(f"{path}  {kb:9.1f} KiB  {time.perf_counter() - t:5.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
