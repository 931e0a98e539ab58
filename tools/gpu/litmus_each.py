"""Every litmus program on this GPU, one at a time, each under a deadline: one JSON line
per (program, policy) as it finishes -- verdict, agreement, seconds -- so a slow or stuck
program names itself instead of taking the whole run with it.
Usage (a CUDA machine): python3 tools/gpu/litmus_each.py [SECONDS_EACH [NAME_PART ...]]
(with NAME_PARTs, only the programs whose name contains one of them: the ones still owed a
GPU truth first, before a slow family uses up the call)"""
import json
import os
import signal
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from litmus.programs import PROGRAMS
from litmus.run import CUDA_POLICIES, run_one_cuda


class Deadline(Exception):
    pass


def _alarm(signum, frame):
    raise Deadline()


def main(each: int, parts) -> int:
    signal.signal(signal.SIGALRM, _alarm)
    bad = 0
    for program in PROGRAMS:
        if parts and not any(part in program.name for part in parts):
            continue
        for policy in CUDA_POLICIES:
            t0 = time.perf_counter()
            signal.alarm(each)
            try:
                row = run_one_cuda(program, policy)
            except Deadline:
                row = {"name": program.name, "policy": policy, "agree": False,
                       "error": f"over {each} s"}
            finally:
                signal.alarm(0)
            row["s"] = round(time.perf_counter() - t0, 2)
            bad += not row.get("agree")
            print(json.dumps(row), flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20, sys.argv[2:]))
