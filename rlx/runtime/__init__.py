"""The user-facing runtime: Session, CompiledGraph, CompileOptions."""
