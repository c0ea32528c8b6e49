"""``rlx run MODEL --input NAME=FILE.npy ...``: run an ONNX (or .rlx) file once on inputs
read from .npy files (the command lives in ``onnx_cmds.py``)."""

from __future__ import annotations

from rlx.cli.onnx_cmds import command

__all__ = ["command"]
