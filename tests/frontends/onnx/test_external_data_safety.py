"""ONNX external data stays inside the model's directory and is what it claims to be
(issue 29): a symlink (of the data file, or of a directory on its way) that leads out of
the model's directory is refused, one that stays inside is followed; ``offset`` /
``length`` must be non-negative integers inside the file; the location must be a regular
file (not a directory, not a FIFO). Each refusal is an OnnxImportError (a ModelError)
naming the tensor, the location, what was expected and what was given."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, external_data_helper, helper, numpy_helper  # noqa: E402

import rlx  # noqa: E402
from rlx.errors import ModelError  # noqa: E402
from rlx.frontends.onnx import OnnxImportError  # noqa: E402
from tests.frontends.blocking import run_guarded  # noqa: E402

W = np.random.default_rng(29).standard_normal((16, 5)).astype(np.float32)
NBYTES = W.nbytes  # 320: more than CONST_LIMIT elements, so "w" is a param
OUTSIDE = np.arange(W.size, dtype=np.float32).reshape(W.shape)  # same size, other values

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink"), reason="no os.symlink")
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no os.mkfifo")


def save_model(
    folder: Path,
    location: str,
    *,
    offset: int | str | None = None,
    length: int | str | None = None,
) -> Path:
    """``folder/m.onnx``: y = x @ w, with w's data in external file ``location`` (written
    by the caller) at ``offset`` / ``length`` (strings are stored as they are)."""
    t = numpy_helper.from_array(W, "w")
    external_data_helper.set_external_data(t, location)
    t.ClearField("raw_data")
    for key, value in (("offset", offset), ("length", length)):
        if value is not None:
            e = t.external_data.add()
            e.key, e.value = key, str(value)
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "ext",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])],
        [t],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


def outside_file(tmp_path: Path) -> Path:
    """A data file outside the model's directory, of exactly the size w needs."""
    (tmp_path / "outside").mkdir()
    secret = tmp_path / "outside" / "secret.bin"
    secret.write_bytes(OUTSIDE.tobytes())
    return secret


def refused(path: Path, *parts: str) -> OnnxImportError:
    with pytest.raises(OnnxImportError) as e:
        rlx.onnx.load(path)
    assert isinstance(e.value, ModelError)
    for part in ("'w'", *parts):
        assert part in str(e.value), f"{part!r} not in {str(e.value)!r}"
    return e.value


@needs_symlinks
def test_symlinked_file_pointing_outside_is_refused(tmp_path) -> None:
    secret = outside_file(tmp_path)
    folder = tmp_path / "model"
    path = save_model(folder, "w.bin")
    os.symlink(secret, folder / "w.bin")
    err = refused(path, "'w.bin'", "outside", str(secret.resolve()))
    assert "model's directory" in str(err)
    assert secret.read_bytes() == OUTSIDE.tobytes()


@needs_symlinks
def test_relative_symlink_pointing_outside_is_refused(tmp_path) -> None:
    secret = outside_file(tmp_path)
    folder = tmp_path / "model"
    path = save_model(folder, "w.bin")
    os.symlink(os.path.join("..", "outside", "secret.bin"), folder / "w.bin")
    refused(path, "'w.bin'", "outside", str(secret.resolve()))


@needs_symlinks
def test_symlinked_dir_pointing_outside_is_refused(tmp_path) -> None:
    secret = outside_file(tmp_path)
    folder = tmp_path / "model"
    path = save_model(folder, "sub/secret.bin")
    os.symlink(secret.parent, folder / "sub", target_is_directory=True)
    refused(path, "'sub/secret.bin'", "outside", str(secret.resolve()))


@needs_symlinks
def test_symlinks_inside_the_folder_are_followed(tmp_path) -> None:
    real = tmp_path / "model" / "data"
    real.mkdir(parents=True)
    pad = b"\xab" * 12
    (real / "real.bin").write_bytes(pad + W.tobytes())
    folder = tmp_path / "model"
    # a file symlink with an absolute target, a directory symlink with a relative one
    os.symlink(real / "real.bin", folder / "w.bin")
    os.symlink("data", folder / "link", target_is_directory=True)
    for loc in ("w.bin", "link/real.bin", "data/real.bin"):
        path = save_model(folder, loc, offset=len(pad), length=NBYTES)
        m = rlx.onnx.load(path)
        np.testing.assert_array_equal(m.params["w"], W)
        x = np.random.default_rng(1).standard_normal((2, 16)).astype(np.float32)
        np.testing.assert_allclose(x @ m.params["w"], x @ W)
    # the model's own directory reached through a symlink: still inside
    os.symlink(folder, tmp_path / "alias", target_is_directory=True)
    m = rlx.onnx.load(tmp_path / "alias" / "m.onnx")
    np.testing.assert_array_equal(m.params["w"], W)


def _data_file(tmp_path: Path, extra: int = 0) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "w.bin").write_bytes(W.tobytes() + b"\0" * extra)
    return folder


@pytest.mark.parametrize("value", ["abc", "", "1.5", "0x10", " 4", "1_0", "-4"])
def test_offset_must_be_a_non_negative_integer(tmp_path, value) -> None:
    folder = _data_file(tmp_path, extra=64)
    path = save_model(folder, "w.bin", offset=value)
    refused(path, "offset", repr(value), "'w.bin'", "non-negative integer")


@pytest.mark.parametrize("value", ["abc", "-320", "+320"])
def test_length_must_be_a_non_negative_integer(tmp_path, value) -> None:
    folder = _data_file(tmp_path)
    path = save_model(folder, "w.bin", length=value)
    refused(path, "length", repr(value), "'w.bin'", "non-negative integer")


def test_offset_and_length_past_the_end_are_refused(tmp_path) -> None:
    folder = _data_file(tmp_path, extra=8)
    size = NBYTES + 8
    path = save_model(folder, "w.bin", offset=12, length=NBYTES)  # ends 4 bytes past
    refused(path, "'w.bin'", "past the end", f"[12, {12 + NBYTES})", f"({size} bytes)")
    path = save_model(folder, "w.bin", offset=10**30, length=NBYTES)
    refused(path, "'w.bin'", "past the end")
    path = save_model(folder, "w.bin", length=size)  # longer than w's bytes
    refused(path, f"length {size} bytes", f"need {NBYTES}")
    path = save_model(folder, "w.bin", offset=8, length=NBYTES)  # ends at the last byte
    want = np.frombuffer((W.tobytes() + b"\0" * 8)[8:], np.float32).reshape(W.shape)
    np.testing.assert_array_equal(rlx.onnx.load(path).params["w"], want)


def test_location_that_is_a_directory_is_refused(tmp_path) -> None:
    folder = tmp_path / "model"
    (folder / "w.bin").mkdir(parents=True)
    path = save_model(folder, "w.bin")
    refused(path, "'w.bin'", "is a directory", "want a regular file")


@needs_fifo
def test_location_that_is_a_fifo_is_refused(tmp_path) -> None:
    folder = tmp_path / "model"
    path = save_model(folder, "w.bin")
    os.mkfifo(folder / "w.bin")
    out = run_guarded(lambda: rlx.onnx.load(path), folder / "w.bin", "rlx.onnx.load")
    err = out.get("error")
    assert isinstance(err, OnnxImportError), out
    for part in ("'w'", "'w.bin'", "FIFO", "want a regular file"):
        assert part in str(err), f"{part!r} not in {str(err)!r}"


def test_missing_location_and_parent_escape_still_refused(tmp_path) -> None:
    folder = tmp_path / "model"
    path = save_model(folder, "gone.bin")
    refused(path, "'gone.bin'", "does not exist")
    outside_file(tmp_path)
    path = save_model(folder, "../outside/secret.bin")
    refused(path, "'../outside/secret.bin'", "relative path inside")
