"""A pytest plugin (``-p small_matrix``) and a helper that shrink the mutation matrix to a
few cells: the two slot-reuse probes on one seed each, a seeded bug they kill and one that
changes nothing (it must survive). Loaded by a ``pytest --specrace-matrix`` subprocess --
its xdist workers too -- and applied in-process for the CLI's side, so both sides run the
same cells."""
import dataclasses

import matrix.run as mx
from mutations import BY_NAME, Mutation

HARMLESS = Mutation(
    "finish-flag-spelled-differently", "the same flag, written another way (changes nothing)",
    "test", "impl.scheduler:Scheduler._finish",
    (("        req.finished = True\n", "        req.finished = bool(1)\n"),), ("slot-reuse",))
KILLED = BY_NAME["pool-edge-off-by-one"]


def shrink(setattr_=setattr) -> None:
    setattr_(mx, "PROBES", {k: dataclasses.replace(mx.PROBES[k], seeds=(0,))
                            for k in ("slot-reuse", "slot-reuse-stall")})
    setattr_(mx, "mutations_for", lambda target: [KILLED, HARMLESS])


def pytest_configure(config):
    shrink()
