"""Symbolic dims: ``Sym("seq")`` is the obvious spelling of a symbol, and a malformed Sym
(bad name, power, coefficient or terms) or a bad bound is a ShapeError when it is built,
never a bare ValueError / ZeroDivisionError later."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import rlx
from rlx.errors import ShapeError
from rlx.shape import Shape, Sym, check_bounds, sym


def test_sym_of_a_name_is_the_symbol():
    assert Sym("seq") == sym("seq") == Sym.named("seq")
    assert hash(Sym("seq")) == hash(sym("seq")) and str(Sym("seq")) == "seq"
    assert Sym("seq", 2) == sym("seq") * 2 and str(Sym("seq", 2)) == "2*seq"
    g = rlx.Graph("g")
    x = g.input("x", (Sym("seq"), 3))
    g.set_outputs(g.reshape(x, (Sym("seq", 3),)))
    a = np.arange(12, dtype=np.float32).reshape(4, 3)
    (out,) = g.evaluate({"x": a})
    np.testing.assert_array_equal(out, a.reshape(-1))
    assert Shape((Sym("seq"), 3)).concrete({"seq": 5}) == (5, 3)


def test_terms_are_kept_in_one_order_and_repeats_multiply():
    assert Sym((("b", 1), ("a", 2)), 3) == sym("a") * sym("a") * sym("b") * 3
    assert Sym([("a", 1), ("a", 1)]).terms == (("a", 2),)
    assert Sym((("a", np.int64(2)),)).terms == (("a", 2),)


@pytest.mark.parametrize(
    "args, message",
    [
        ((((("s", 0),)),), r"power of 's' must be an int >= 1, got 0"),
        (((("s", -1),),), r"power of 's' must be an int >= 1, got -1"),
        (((("s", True),),), r"power of 's' must be an int >= 1, got True"),
        (((("s", 1.5),),), r"power of 's' must be an int >= 1, got 1.5"),
        (((("1x", 1),),), r"name must be an identifier, got '1x'"),
        (("a b",), r"name must be an identifier, got 'a b'"),
        (("",), r"name must be an identifier, got ''"),
        (("s", 0), r"coefficient must be an int >= 1, got 0"),
        (("s", -2), r"coefficient must be an int >= 1, got -2"),
        (("s", 2.0), r"coefficient must be an int >= 1, got 2.0"),
        (((), 3), r"needs at least one symbol \(use an int\)"),
        ((42,), r'terms must be a symbol name .* write Sym\("seq"\), sym\("seq"\)'),
        (((("s",),),), r"term \('s',\) is not a \(name, power\) pair"),
        ((((1, 1),),), r"term \(1, 1\) is not a \(name, power\) pair"),
    ],
)
def test_malformed_syms_are_refused_when_built(args, message):
    with pytest.raises(ShapeError, match=message):
        Sym(*args)


def test_symbol_bounds_are_checked():
    g = rlx.Graph("g")
    assert g.sym("n", min=0, max=0) == Sym("n") and g.sym_bounds["n"] == (0, 0)
    for lo, hi, msg in [
        (-1, None, "min must be an int >= 0, got -1"),
        (5, 3, "max 3 < min 5"),
        (1, 2.5, "max must be an int or None, got 2.5"),
        (True, None, "min must be an int >= 0, got True"),
    ]:
        with pytest.raises(ShapeError, match=f"symbolic dim 'm': {msg}"):
            g.sym("m", min=lo, max=hi)
    assert "m" not in g.sym_bounds
    with pytest.raises(ShapeError, match="identifier, got 'no good'"):
        check_bounds("no good", 1, None)


_names = st.sampled_from(["a", "b", "seq", "batch"])


@given(
    st.lists(st.tuples(_names, st.integers(1, 3)), min_size=1, max_size=4),
    st.integers(1, 50),
    st.fixed_dictionaries({n: st.integers(0, 9) for n in ["a", "b", "seq", "batch"]}),
)
def test_a_sym_evaluates_to_its_monomial(terms, coeff, values):
    """Against a plain Python product of the terms as given (any order, repeats)."""
    want = coeff * math.prod(values[n] ** p for n, p in terms)
    assert Sym(tuple(terms), coeff).evaluate(values) == want
