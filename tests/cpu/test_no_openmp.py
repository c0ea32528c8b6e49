"""Native kernels built by a compiler without OpenMP (Apple's clang has no libomp):
``RLX_CC`` names a gcc wrapper that refuses ``-fopenmp``, so rlx's probe finds no OpenMP
and every library (regions, rows, sgemm, attention, layer norm, the schedule) is built
without it, its ``#pragma omp`` ignored. A small encoder and a GEMM chain, run in a fresh
process, must give what NumPy's reference interpreter gives."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

GCC = shutil.which("gcc")

SCRIPT = textwrap.dedent(
    """
    import numpy as np
    import rlx
    from rlx.backends.cpu import native
    from rlx.backends.reference import evaluate
    from rlx.models import encoder, random_params
    from rlx.options import CompileOptions
    from rlx.runtime.session import Session

    assert native.gcc_path().endswith("cc-no-openmp"), native.gcc_path()
    assert not native.openmp_supported()
    g = encoder(layers=2, hidden=64, heads=4, ffn=128, seq=rlx.sym("seq"),
                batch=rlx.sym("batch"), fused_attention=True)
    ps = random_params(g, 3)
    opts = CompileOptions(use_cache=False, verbose=False, num_threads=2)
    cg = Session("cpu").compile(g, opts, params=ps)
    for b, s in [(1, 5), (2, 17)]:
        x = np.random.default_rng(s).standard_normal((b, s, 64)).astype(np.float32)
        got = cg.run({"x": x})[0]
        want = evaluate(g, {"x": x}, ps)[0]
        np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)
    built = sorted(p.name.split("-")[0] for p in native.cache_info().dir.glob("*.so"))
    assert built, "no native library was built"
    print("OK", " ".join(built))
    """
)


@pytest.mark.slow
@pytest.mark.skipif(GCC is None, reason="needs gcc")
def test_kernels_built_without_openmp_match_the_reference(tmp_path: Path) -> None:
    wrapper = tmp_path / "cc-no-openmp"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for a in "$@"; do [ "$a" = "-fopenmp" ] && { echo "no OpenMP here" >&2; exit 1; }; done\n'
        f'exec {GCC} "$@"\n'
    )
    wrapper.chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {**os.environ, "RLX_CC": str(wrapper), "RLX_CACHE_DIR": str(cache)}
    r = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("OK"), r.stdout
