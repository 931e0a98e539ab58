"""The litmus suite: small programs with a known verdict (stale or not, a race or not)
under each schedule policy (``programs``), and the oracle that runs them on a backend
and checks the verdicts (``run``) -- how we know the simulator and the CUDA backend
agree with the hardware."""
