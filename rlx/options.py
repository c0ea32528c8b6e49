"""CompileOptions: every knob of ``Session.compile`` in one frozen dataclass."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Any

from rlx import config

__all__ = ["CompileOptions", "VerifyMode"]


class VerifyMode(enum.Enum):
    EACH_PASS = "each"  # verify after every pass (tests use this)
    END = "end"  # verify once, after the last pass
    OFF = "off"


def _default_verify() -> VerifyMode:
    v = config.verify_mode()
    return VerifyMode(v) if v else VerifyMode.END


@dataclass(frozen=True)
class CompileOptions:
    """Options for ``Session.compile``. All fields have safe defaults.

    num_threads: threads for BLAS and native kernels (None: physical cores).
    check_finite: raise InputError when an input holds NaN or Inf.
    optimize: run the cleanup passes (DCE, CSE, folding, simplification).
    fuse: run the fusion passes.
    fuse_blocks: also fuse whole attention blocks and transformer layers
        (``fused_attention_block``, ``fused_transformer_layer``; off by default: on
        all-MiniLM-L6-v2 they are no faster than the layer's own kernels).
    precision: a ``PrecisionPolicy`` (None means AlwaysF32).
    freeze_params: treat params given at compile time as constants (enables folding).
    verify: when the pipeline runs the verifier.
    disabled_passes: pass names to skip.
    verbose: print the reports (default from RLX_VERBOSE).
    use_cache: reuse a previous compile of a structurally equal graph.
    native: use native (C) kernels where available.
    max_shape_plans: how many distinct symbolic-shape schedules to keep (a schedule holds
        no arena: an evicted one costs a re-plan of a few ms).
    native_schedule: run consecutive native kernels as one C loop over kernel
        descriptors (``rlx/backends/cpu/native/schedule.py``); False runs every kernel
        from Python (the oracle). Needs ``native``.
    batch_invariant: each row's result has the same bits whatever batch and padding it
        runs in: f32 products stay on rlx's sgemm for every shape instead of the per-shape
        BLAS-or-native choice at one thread (whose two kernels round apart). SentenceEncoder
        sets it, so a server's coalesced batches equal each request encoded alone.
    """

    num_threads: int | None = None
    check_finite: bool = False
    optimize: bool = True
    fuse: bool = True
    fuse_blocks: bool = False
    precision: Any = None
    freeze_params: bool = False
    verify: VerifyMode = field(default_factory=_default_verify)
    disabled_passes: tuple[str, ...] = ()
    verbose: bool = field(default_factory=config.verbose)
    use_cache: bool = True
    native: bool = True
    max_shape_plans: int = 8
    native_schedule: bool = True
    batch_invariant: bool = False

    def replace(self, **kw: Any) -> CompileOptions:
        """A copy with the given fields changed (``dataclasses.replace``)."""
        return replace(self, **kw)

    def cache_key(self) -> tuple[Any, ...]:
        """The options that change what compile produces (not verbosity)."""
        return (
            self.num_threads,
            self.check_finite,
            self.optimize,
            self.fuse,
            self.fuse_blocks,
            repr(self.precision),
            self.freeze_params,
            self.disabled_passes,
            self.native,
            self.batch_invariant,
        )
