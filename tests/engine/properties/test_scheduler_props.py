"""Stateful property test of the scheduler (examples per run come from the Hypothesis profile)."""

from .prop_sched_machine import SchedulerMachine

TestSchedulerMachine = SchedulerMachine.TestCase
