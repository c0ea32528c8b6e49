"""The C entry points' ctypes signatures, read from their prototypes
(rlx/backends/cpu/native/bindings.py): the mapping of C types, what counts as an entry
point, the errors for what it cannot type, one table per C file of ``csrc/``, and the
libraries the kernels load typed from them."""

import ctypes
import os
import textwrap

import pytest

from rlx.backends.cpu import native
from rlx.backends.cpu.native import bindings
from rlx.errors import CompileError

P, L, I, F, D = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float, ctypes.c_double


def test_prototypes_map_to_ctypes() -> None:
    src = textwrap.dedent("""
    #define RLX_TWICE(NAME, T) T NAME(T x) { return x + x; }
    /* int rlx_commented(void); */
    static inline int rlx_private(int x) { return x; }
    typedef unsigned short elt;
    int rlx_count(void) { return 3; }
    double rlx_mix(const float *a, elt *b, long n, int k,
                   float s, double t, int64_t big, int32_t small) { return 0; }
    void rlx_declared(const void *p, long n);
    void rlx_declared(const void *p, long n) {}
    long rlx_no_names(long, int);
    RLX_TWICE(rlx_twice_f, float)
    """)
    sig = bindings.signatures(src)
    assert set(sig) == {"rlx_count", "rlx_mix", "rlx_declared", "rlx_no_names"}
    assert sig["rlx_count"] == (I, ())
    assert sig["rlx_mix"] == (D, (P, P, L, I, F, D, L, I))
    assert sig["rlx_declared"] == (None, (P, L))
    assert sig["rlx_no_names"] == (L, (L, I))


def test_disagreeing_prototypes_and_unknown_types_are_errors() -> None:
    with pytest.raises(CompileError, match="rlx_f: two prototypes disagree"):
        bindings.signatures("int rlx_f(long n);\nint rlx_f(int n) { return n; }\n")
    with pytest.raises(CompileError, match="rlx_g's parameter 'unsigned short h'.*SCALARS"):
        bindings.signatures("void rlx_g(unsigned short h) {}\n")
    with pytest.raises(CompileError, match="rlx_h's result"):
        bindings.signatures("size_t rlx_h(void) { return 0; }\n")


def test_every_csrc_file_has_a_table() -> None:
    """Each C file of csrc/ yields its table (no prototype it cannot type); together they
    hold every entry point the loaders used to type by hand, and more."""
    total = {}
    for f in sorted(os.listdir(native.CSRC)):
        if f.endswith(".c"):
            total |= bindings.signatures("#define RLX_ATT_DT 0\n" + native.csrc_source(f))
    assert len(total) >= 46
    for name in ("rlx_sgemm", "rlx_qgemm_run", "rlx_dq_gemm", "rlx_attention", "rlx_lut16"):
        assert name in total
    # the adam update is defined by a macro: typed from the prototypes declared beside it
    assert total["rlx_adam_update_f32"] == (None, (P,) * 4 + (L,) + (F,) * 8 + (I, I))
    assert total["rlx_adam_update_f64"] == (None, (P,) * 4 + (L,) + (D,) * 8 + (I, I))


@pytest.mark.skipif(not native.available(), reason="needs gcc")
def test_loaded_libraries_are_typed_from_their_source() -> None:
    from rlx.backends.cpu.native.cpu import selected_target

    lib = bindings.csrc_library(("conv.c",), selected_target(), "conv")
    for name, (restype, argtypes) in bindings.signatures(native.csrc_source("conv.c")).items():
        fn = getattr(lib, name)
        assert fn.restype is restype and tuple(fn.argtypes) == argtypes
    assert lib.rlx_pool2d_f32.argtypes == [P, P, P, I]
