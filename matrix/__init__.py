"""The mutation kill matrix: the seeded bugs (``mutations``: impl's, upstream's and the
EAGLE slice's, plus candidate fixes of upstream), the probes that must catch each one
and the run over them (``run``), and the pure result table (``table``)."""
