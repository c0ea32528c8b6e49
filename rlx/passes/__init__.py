"""Graph passes and the compile pipeline (HIR -> MIR -> optimized MIR -> LIR)."""
