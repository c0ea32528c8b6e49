"""The user-facing runtime: Session, CompiledGraph (CompileOptions: ``rlx/options.py``)."""
