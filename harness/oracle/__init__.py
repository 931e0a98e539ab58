"""Layer 4: oracles -- the verdicts a run is judged by (stale values, grammar, races),
the trial runner, repro aggregation and the Hypothesis state machines."""
