"""The IR: MIR graph, HIR modules, LIR plan, verifier, printer, serialization."""
