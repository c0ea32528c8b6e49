"""The helpers of benchmarks/embed.py (no timing, no peers): the sentence generator, the
shape / argument parsing, the round plans and the agreement measure (against NumPy)."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

_BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, _BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


for _name in ("_common", "_embed_worker"):
    if _name not in sys.modules:
        _load(_name)
embed = _load("embed")


def test_sentences_deterministic_and_in_range():
    a, b = embed.sentences(300, seed=0), embed.sentences(300, seed=0)
    assert a == b
    assert embed.sentences(300, seed=1) != a
    counts = [len(s.split()) for s in a]
    assert min(counts) >= 4 and max(counts) <= 120
    assert max(counts) - min(counts) > 80  # mixed lengths, not one size
    assert all(s.endswith(".") and s[0].isupper() for s in a)
    vocab = set(embed.WORDS)
    assert all(w.strip(",.").lower() in vocab for s in a[:20] for w in s.split())


def test_sentences_bounds():
    assert embed.sentences(0) == []
    assert all(len(s.split()) == 5 for s in embed.sentences(10, lo=5, hi=5))
    with pytest.raises(ValueError, match="lo <= hi"):
        embed.sentences(3, lo=9, hi=2)


@pytest.mark.parametrize("text,shape", [("8x128", (8, 128)), ("1X16", (1, 16))])
def test_parse_shape(text, shape):
    assert embed.parse_shape(text) == shape


@pytest.mark.parametrize("text", ["8", "8x", "x128", "0x16", "8x1", "axb"])
def test_parse_shape_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="shape"):
        embed.parse_shape(text)


def test_parse_args_defaults_and_subcommand():
    a = embed.parse_args([])
    assert a.what == "all" and a.peer_python == sys.executable
    assert a.shapes == [(1, 16), (8, 128), (32, 128)] and a.threads == [1, 2]
    a = embed.parse_args(["encode", "--peer-python", "/x/python", "--shapes", "2x32"])
    assert (a.what, a.peer_python, a.shapes) == ("encode", "/x/python", [(2, 32)])
    with pytest.raises(SystemExit):
        embed.parse_args(["--threads", "0"])


def test_plan_scales_and_has_a_floor():
    assert embed.plan((1, 16), 1.0) == embed.PLANS[16]
    assert embed.plan((32, 128), 1.0) == embed.PLANS[4096]
    assert embed.plan((8, 128), 0.01)[0] == 3


def test_agreement_against_numpy():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((2, 5, 8))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    out = ref.copy()
    out[0, 4] = -ref[0, 4]  # a padding position: ignored
    tok, sent = embed.agreement(out, ref, mask)
    assert tok == pytest.approx(1.0) and sent == pytest.approx(1.0)
    out[1, 2] = -ref[1, 2]  # a real token flipped: cosine -1 for it
    tok, sent = embed.agreement(out, ref, mask)
    assert tok == pytest.approx(-1.0)
    po = out[1].mean(0)
    pr = ref[1].mean(0)
    expect = po @ pr / (np.linalg.norm(po) * np.linalg.norm(pr))
    assert sent == pytest.approx(min(1.0, expect))
