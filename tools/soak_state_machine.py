"""Soak: the fixed engine against N generated state-machine programs (a benchmark run,
not a test; the suite runs a few dozen). Usage: python tools/soak_state_machine.py N"""
import sys
import time

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.oracle.machine import EngineMachine

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
t = time.perf_counter()
run_state_machine_as_test(EngineMachine, settings=settings(
    max_examples=n, stateful_step_count=25, deadline=None, database=None,
    suppress_health_check=list(HealthCheck)))
print(f"fixed engine survived {n} generated programs (<= 25 steps each) in "
      f"{time.perf_counter() - t:.0f} s")
