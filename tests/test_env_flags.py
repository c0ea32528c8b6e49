"""Every RLX_* flag accepts exactly the values rlx/config.py documents (words in any case,
surrounding whitespace ignored) and refuses anything else, an empty value included (but
RLX_VERBOSE's documented empty = off), with a ConfigError naming the variable, the value
and the values accepted (issue 29)."""

from pathlib import Path

import numpy as np
import pytest

import rlx
from rlx import config
from rlx.errors import ConfigError
from rlx.runtime.options import VerifyMode

FLAGS = (
    "RLX_VERBOSE",
    "RLX_CACHE_DIR",
    "RLX_NUM_THREADS",
    "RLX_VERIFY",
    "RLX_ISA",
    "RLX_CACHE_MAX_MB",
    "RLX_SGEMM",
    "RLX_DQ_ACT",
    "RLX_DQ_REPACK",
    "RLX_OPENMP",
    "RLX_DQ_BF16",
    "RLX_DQ_Q8_DIGITS",
)

# flag -> its reader; the documented values (as given, in several cases) -> what is read
READ = {
    "RLX_VERBOSE": config.verbose,
    "RLX_CACHE_DIR": config.cache_dir,
    "RLX_NUM_THREADS": config.num_threads,
    "RLX_VERIFY": config.verify_mode,
    "RLX_ISA": config.isa,
    "RLX_CACHE_MAX_MB": config.cache_max_bytes,
    "RLX_SGEMM": config.sgemm,
    "RLX_DQ_ACT": config.dq_act,
    "RLX_DQ_REPACK": config.dq_repack,
    "RLX_OPENMP": config.openmp,
    "RLX_DQ_BF16": config.dq_bf16,
    "RLX_DQ_Q8_DIGITS": config.dq_q8_digits,
}

GOOD = [
    ("RLX_VERBOSE", "off", False),
    ("RLX_VERBOSE", "False", False),
    ("RLX_VERBOSE", "NO", False),
    ("RLX_VERBOSE", "", False),  # documented: empty is off
    ("RLX_VERBOSE", " On ", True),
    ("RLX_VERBOSE", "YES", True),
    ("RLX_VERIFY", "EACH", "each"),
    ("RLX_VERIFY", " End", "end"),
    ("RLX_VERIFY", "off", "off"),
    ("RLX_ISA", "Portable", "portable"),
    ("RLX_ISA", "AUTO", "auto"),
    ("RLX_SGEMM", "BLAS", "blas"),
    ("RLX_DQ_ACT", "Q8", "q8"),
    ("RLX_DQ_REPACK", " Off", False),
    ("RLX_DQ_REPACK", "1", True),
    ("RLX_OPENMP", " Shim", "shim"),
    ("RLX_OPENMP", "OFF", "off"),
    ("RLX_OPENMP", "auto", "auto"),
    ("RLX_DQ_BF16", "off", False),
    ("RLX_DQ_BF16", " YES", True),
    ("RLX_DQ_Q8_DIGITS", "Off", False),
    ("RLX_DQ_Q8_DIGITS", "1", True),
    ("RLX_NUM_THREADS", " 1 ", 1),
    ("RLX_NUM_THREADS", "01", 1),
    ("RLX_CACHE_MAX_MB", "3", 3 << 20),
]

BAD = [
    ("RLX_VERBOSE", "maybe", "1, true, yes, on"),
    ("RLX_VERBOSE", "2", "0, false, no, off"),
    ("RLX_VERBOSE", "enabled", "1, true, yes, on"),
    ("RLX_VERIFY", "EVERY", "each, end, off"),
    ("RLX_VERIFY", "", "each, end, off"),
    ("RLX_VERIFY", "  ", "each, end, off"),
    ("RLX_ISA", "sse9", "auto, avx512, avx2, portable"),
    ("RLX_ISA", "", "auto, avx512, avx2, portable"),
    ("RLX_SGEMM", "mkl", "auto, native, blas"),
    ("RLX_SGEMM", "", "auto, native, blas"),
    ("RLX_DQ_ACT", "int4", "auto, q8, f32"),
    ("RLX_DQ_ACT", "", "auto, q8, f32"),
    ("RLX_DQ_REPACK", "2", "1, true, yes, on"),
    ("RLX_OPENMP", "libomp", "auto, shim, off"),
    ("RLX_OPENMP", "", "auto, shim, off"),
    ("RLX_CACHE_DIR", "", "directory path"),
    ("RLX_CACHE_DIR", "   ", "directory path"),
    ("RLX_NUM_THREADS", "", "integer >= 1"),
    ("RLX_NUM_THREADS", "0", "integer >= 1"),
    ("RLX_NUM_THREADS", "+4", "integer >= 1"),  # int() takes these three
    ("RLX_NUM_THREADS", "1_0", "integer >= 1"),
    ("RLX_NUM_THREADS", "\u0664", "integer >= 1"),  # an Arabic-Indic four
    ("RLX_NUM_THREADS", "2.0", "integer >= 1"),
    ("RLX_CACHE_MAX_MB", "", "integer >= 1"),
    ("RLX_CACHE_MAX_MB", "0", "integer >= 1"),
    ("RLX_CACHE_MAX_MB", "1e3", "integer >= 1"),
]


@pytest.fixture(autouse=True)
def _no_flags(monkeypatch):
    for name in FLAGS:
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(("name", "value", "want"), GOOD)
def test_documented_values_are_read_in_any_case(monkeypatch, name, value, want):
    monkeypatch.setenv(name, value)
    assert READ[name]() == want


@pytest.mark.parametrize(("name", "value", "allowed"), BAD)
def test_other_values_are_a_config_error_naming_variable_value_and_allowed(
    monkeypatch, name, value, allowed
):
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        READ[name]()
    text = str(info.value)
    assert text.startswith(f"{name}={value!r}"), text
    assert allowed in text, text


def test_empty_cache_dir_is_refused_and_unset_is_the_default(monkeypatch):
    monkeypatch.setenv("RLX_CACHE_DIR", "")
    with pytest.raises(ConfigError, match=r"RLX_CACHE_DIR='' is empty; give a directory path"):
        config.cache_dir()
    monkeypatch.delenv("RLX_CACHE_DIR")
    assert config.cache_dir() == Path.home() / ".cache" / "rlx"


def test_unset_flags_take_their_defaults():
    assert config.verbose() is False
    assert config.verify_mode() is None
    assert rlx.CompileOptions().verify is VerifyMode.END  # users' default (tests: each)
    assert config.num_threads() is None
    assert config.isa() == "auto" and config.sgemm() == "auto" and config.dq_act() == "f32"
    assert config.dq_repack() is True and config.openmp() == "auto"
    assert config.cache_max_bytes() == 512 << 20


@pytest.mark.parametrize(
    ("name", "value", "field", "want"),
    [
        ("RLX_VERBOSE", "off", "verbose", False),
        ("RLX_VERBOSE", "False", "verbose", False),
        ("RLX_VERBOSE", "ON", "verbose", True),
        ("RLX_VERIFY", "EACH", "verify", VerifyMode.EACH_PASS),
        ("RLX_VERIFY", "Off", "verify", VerifyMode.OFF),
    ],
)
def test_flags_reach_compile_options(monkeypatch, name, value, field, want):
    """Not only parsed: the spellings the issue names take effect in CompileOptions."""
    monkeypatch.setenv(name, value)
    assert getattr(rlx.CompileOptions(), field) == want


def test_a_bad_flag_fails_compile_instead_of_being_ignored(monkeypatch):
    g = rlx.Graph("g")
    x = g.input("x", (2,))
    g.set_outputs(g.exp(x))
    monkeypatch.setenv("RLX_VERIFY", "")
    with pytest.raises(ConfigError, match="RLX_VERIFY"):
        rlx.Session("cpu").compile(g)
    monkeypatch.setenv("RLX_VERIFY", "each")
    (y,) = rlx.Session("cpu").compile(g).run({"x": np.zeros(2, np.float32)})
    assert np.array_equal(y, np.ones(2, np.float32))
