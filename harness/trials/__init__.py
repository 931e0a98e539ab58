"""Layer 4, the engine room: what runs the code under test and gathers the runs.

``drive`` runs a workload through a target's scheduler under a fault plan; ``reference``
is the synchronous run it is judged against (cached); ``run_trial`` is one judged run
(the judges live in ``harness.oracle``); ``run_repro`` aggregates N trials into a
``ReproResult`` (``results``), the typed record every report and console line is made
from. The engine calls the judges, never the other way round.
"""
