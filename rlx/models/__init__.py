"""Model graphs: synthetic transformer encoders/decoders for benchmarks and tests."""

from rlx.models.synthetic import decoder, encoder, random_inputs, random_params, rope_tables

__all__ = ["encoder", "decoder", "random_params", "random_inputs", "rope_tables"]
