"""Layer 4, the judges: what decides a verdict -- stale values and outputs against the
synchronous reference (``stale``), constrained outputs against their grammar (``grammar``),
and the ``Divergence`` they report -- plus the workloads and the Hypothesis state
machines. What runs the engine and gathers the runs is ``harness.trials``."""
