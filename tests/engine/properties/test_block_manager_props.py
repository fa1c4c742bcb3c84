"""Stateful property test of the block manager (examples per run come from the Hypothesis profile)."""

from .prop_block_machine import BlockManagerMachine

TestBlockManagerMachine = BlockManagerMachine.TestCase
