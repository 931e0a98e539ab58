"""Oracles: the verdicts a run is judged by (litmus agreement, stale values, races)."""
from .litmus import run_litmus

__all__ = ["run_litmus"]
