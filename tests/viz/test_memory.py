"""The memory timeline: buffers derived from a plan against the planner's own figures
(the most bytes live at one step, with 64-byte sizes, is the plan's lower bound; with the
planner's lifetimes computed separately), no two buffers live at once share a byte, one
bar per owned working slot (counted straight from the plan's slots), and each bar's
geometry is its buffer's steps and bytes."""

from __future__ import annotations

import re

import pytest

import rlx
from rlx.backends.cpu.planner import plan_memory
from rlx.ir.lir import BufferPlan
from rlx.models import synthetic
from rlx.viz.memory import _H, _LEFT, _TOP, buffers, live_bytes, plot_width, timeline_svg


def _owned_working(plan: BufferPlan) -> set[int]:
    return {
        n
        for n, s in plan.slots.items()
        if s.view_of is None
        and s.inplace_of is None
        and s.offset >= plan.persistent_bytes
        and s.nbytes > 0
    }


def _graphs() -> list[tuple[rlx.Graph, dict[str, int]]]:
    enc = synthetic.encoder(layers=2, hidden=32, heads=4, ffn=64, seq=rlx.sym("seq"), batch=2)
    dec = synthetic.decoder(layers=2, hidden=32, heads=4, ffn=64, seq=8)
    return [(enc, {"seq": 12}), (dec, {})]


@pytest.mark.parametrize("case", range(2))
def test_buffers_against_the_plan(case: int) -> None:
    g, binds = _graphs()[case]
    plan = plan_memory(g, binds)
    bufs, steps = buffers(g, plan)
    assert {b.node for b in bufs} == _owned_working(plan)
    members = [m for b in bufs for m in b.members]
    assert len(members) == len(set(members))  # a node belongs to one buffer at most
    assert len(steps) == len(set(steps))
    live = [0] * len(steps)
    for b in bufs:
        assert 0 <= b.first <= b.last < len(steps)
        for t in range(b.first, b.last + 1):
            live[t] += -(-b.nbytes // plan.alignment) * plan.alignment
    assert max(live) == plan.lower_bound_bytes
    assert live == live_bytes(bufs, len(steps), plan.alignment)
    for i, a in enumerate(bufs):  # a sound plan: buffers live at once never share a byte
        for b in bufs[i + 1 :]:
            if a.first <= b.last and b.first <= a.last:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset


def test_timeline_bars_match_the_buffers() -> None:
    g, binds = _graphs()[0]
    plan = plan_memory(g, binds)
    svg, count = timeline_svg(g, plan, {}, {})
    bars = re.findall(
        r'<rect class="buf" data-node="(\d+)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)" '
        r'height="([\d.]+)"',
        svg,
    )
    assert count == len(bars) == len(_owned_working(plan))
    found, steps = buffers(g, plan)
    bufs = {b.node: b for b in found}
    step_w = plot_width(len(steps)) / len(steps)
    for n, x, y, w, h in bars:
        b = bufs[int(n)]
        assert float(x) == pytest.approx(_LEFT + b.first * step_w, abs=0.01)
        assert float(w) == pytest.approx(
            max((b.last - b.first + 1) * step_w, 1.5), rel=1e-2, abs=0.02
        )
        top, height = float(y), float(h)
        # bigger buffers are taller; a bar's bottom edge is its offset (the y axis grows up)
        assert height == pytest.approx(
            max(b.nbytes * _H / plan.peak_bytes, 1.0), rel=1e-2, abs=0.02
        )
        assert top + height == pytest.approx(_TOP + _H - b.offset * _H / plan.peak_bytes, abs=0.02)
    assert "peak (working region)" in svg and 'id="peak-step"' in svg
