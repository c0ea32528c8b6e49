"""Fixtures of the graph-view tests: a small Llama-shaped decoder (4 layers, so its
page opens collapsed per block) as a MIR graph and compiled, run once at its shape."""

from __future__ import annotations

import pytest

import rlx
from rlx.models import synthetic
from rlx.runtime.compiled import CompiledGraph


def small_decoder(layers: int = 4) -> rlx.Graph:
    """A 4-layer decoder, hidden 32, spelled-out attention over 8 tokens."""
    return synthetic.decoder(layers=layers, hidden=32, heads=4, ffn=64, seq=8)


@pytest.fixture(scope="module")
def decoder_graph() -> rlx.Graph:
    return small_decoder()


@pytest.fixture(scope="module")
def decoder_compiled(decoder_graph: rlx.Graph) -> CompiledGraph:
    params = synthetic.random_params(decoder_graph)
    opts = rlx.CompileOptions(num_threads=1)
    c = rlx.Session("cpu").compile(decoder_graph, params=params, options=opts)
    inputs = synthetic.random_inputs(decoder_graph)
    inputs.update(synthetic.rope_tables(8, 8))
    c.run(inputs)
    return c
