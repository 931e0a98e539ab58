"""Soak: the fixed engine against N generated state-machine programs (a benchmark run,
not a test; the suite runs a few dozen).

Usage: python tools/measure/soak_state_machine.py N [engine|small-pool|grammar]
(``small-pool``: every program through 1-3 request-pool rows and a KV pool a few requests
fill, so rows and KV slots are reused; ``grammar``: requests may carry the grammar
scenarios' JSON schemas; the target is ``$SPECRACE_TARGET``, default impl)."""
import os
import sys
import time

from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from specrace.pytest_matrix import soak_machines

n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
kind = sys.argv[2] if len(sys.argv) > 2 else "engine"
machine = soak_machines()[kind]  # the machines ``pytest --specrace-soak`` runs
t = time.perf_counter()
run_state_machine_as_test(machine, settings=settings(
    max_examples=n, stateful_step_count=25, deadline=None, database=None,
    suppress_health_check=list(HealthCheck)))
print(f"fixed engine ({os.environ.get('SPECRACE_TARGET', 'impl')}, {kind}) survived {n} "
      f"generated programs (<= 25 steps each) in {time.perf_counter() - t:.0f} s")
