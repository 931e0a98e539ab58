"""Layer 4, the judges: what decides a verdict -- stale values and outputs against the
synchronous reference (``stale``), outputs against the target model's greedy continuation
(``model``), constrained outputs against their grammar (``grammar``), and the
``Divergence`` they report -- plus the workloads they judge. What runs the engine and
gathers the runs is ``harness.trials``; the Hypothesis state machines that drive trials
are ``specrace.machines``."""
