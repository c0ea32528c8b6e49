"""Backends: the NumPy reference interpreter (the oracle) and the CPU runtime."""
