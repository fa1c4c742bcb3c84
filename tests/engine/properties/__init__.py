"""Hypothesis property tests of the block manager and scheduler (stateful models, regressions, bites)."""
