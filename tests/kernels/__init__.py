"""Kernel tests (Triton vs the pure-torch references)."""
