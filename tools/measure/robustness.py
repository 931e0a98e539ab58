"""Measure the gate's robustness (issue 22); writes the figures as Markdown on stdout.

A. ``--interrupts N``: N runs of ``specrace repro ngram-filter-race --backend sim --trials 3``
   (the console script, as a user runs it), each sent SIGINT, SIGTERM or SIGKILL at a random
   moment -- uniform over a calibrated run's length, a third of them in its last second (where
   the report is written) -- two at a time, each pair into its own report folder, so every
   run but the first finds the previous set there. After each run: every set folder in the
   report folders has one run id across its files, and staging folders are counted.
B. ``--writers N``: N rounds of two writer processes that write a set of the same name into
   one folder at the same moment (a barrier per round), with different content; after
   each round the set must be whole (one run id) and no staging folder left.
Finally one more write into each folder: no staging folder may remain after it.

Usage: ``python tools/measure/robustness.py --interrupts 200 --writers 200 > figures.md``
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from harness.report.reportset import run_ids  # noqa: E402  (the tree on the path first)

SPECRACE = os.path.join(os.path.dirname(sys.executable), "specrace")
REPRO = ["repro", "ngram-filter-race", "--backend", "sim", "--trials", "3"]
STAGING = ".specrace-tmp-"


def check_dir(report_dir: str) -> tuple:
    """(sets, mixed sets, staging folders) in ``report_dir``."""
    sets = mixed = staging = 0
    for entry in os.listdir(report_dir):
        path = os.path.join(report_dir, entry)
        if entry.startswith(STAGING):
            staging += 1
        elif os.path.isdir(path):
            sets += 1
            try:
                ids = run_ids(path)
                mixed += len(set(ids.values())) != 1
            except (OSError, ValueError, KeyError, IndexError):
                mixed += 1
    return sets, mixed, staging


def _run(cmd, env):
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            cwd=ROOT, text=True)


def calibrate(env) -> float:
    with tempfile.TemporaryDirectory() as d:
        t = time.monotonic()
        p = _run([SPECRACE, *REPRO, "--report-dir", d], env)
        p.communicate()
        return time.monotonic() - t


def interrupts(n: int, rng: random.Random, env) -> dict:
    length = calibrate(env)
    dirs = [tempfile.mkdtemp(prefix="specrace-robust-") for _ in range(2)]
    rcs = collections.Counter()
    by_signal = collections.defaultdict(collections.Counter)
    tracebacks, mixed, staging_seen, bad = 0, 0, 0, []
    sigs = [signal.SIGINT, signal.SIGTERM, signal.SIGKILL]
    done = 0
    while done < n:
        batch = []
        for d in dirs[:min(2, n - done)]:
            sig = rng.choice(sigs)
            late = rng.random() < 1 / 3
            delay = rng.uniform(max(0.0, length - 1.0), length) if late else \
                rng.uniform(0.0, length)
            batch.append((d, sig, delay, _run([SPECRACE, *REPRO, "--report-dir", d], env),
                          time.monotonic()))
        for d, sig, delay, p, t0 in batch:
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            if p.poll() is None:
                p.send_signal(sig)
        for d, sig, delay, p, t0 in batch:
            out, err = p.communicate()
            rcs[p.returncode] += 1
            by_signal[signal.Signals(sig).name][p.returncode] += 1
            if "Traceback" in err or "Exception ignored" in err:
                tracebacks += 1
                bad.append((signal.Signals(sig).name, round(delay, 2), p.returncode,
                            err.strip().splitlines()[-1:]))
            sets, mix, staging = check_dir(d)
            mixed += mix
            staging_seen += staging
            done += 1
    final = _final_writes(dirs, env)
    return {"runs": n, "calibrated_s": round(length, 2), "exit codes": dict(rcs),
            "by signal": {k: dict(v) for k, v in by_signal.items()},
            "tracebacks": tracebacks, "mixed sets": mixed,
            "staging folders seen after a run": staging_seen,
            "staging folders after the next write": final, "bad": bad[:10]}


def _final_writes(dirs, env) -> int:
    left = 0
    for d in dirs:
        p = _run([SPECRACE, *REPRO, "--report-dir", d], env)
        p.communicate()
        left += check_dir(d)[2]
    return left


def _writer(folder: str, tag: str, rounds: int, barrier, result_json: str) -> None:
    import dataclasses
    import pickle

    from harness.report import write_reports
    with open(result_json, "rb") as f:
        result = pickle.load(f)
    for r in range(rounds):
        barrier.wait()
        write_reports(dataclasses.replace(result, command=f"{tag} round {r}"), folder)
        barrier.wait()  # both done: the parent checks
        barrier.wait()  # the parent checked


def writers(rounds: int) -> dict:
    import pickle
    from scenarios.resolve import run_scenario_result
    result = run_scenario_result("ngram-filter-race", backend="sim", trials=1)
    folder = tempfile.mkdtemp(prefix="specrace-writers-")
    blob = os.path.join(folder, "..", os.path.basename(folder) + ".pickle")
    with open(blob, "wb") as f:
        pickle.dump(result, f)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(3)
    procs = [ctx.Process(target=_writer, args=(folder, tag, rounds, barrier, blob))
             for tag in ("A", "B")]
    for p in procs:
        p.start()
    mixed = staging = 0
    winners = collections.Counter()
    t = time.monotonic()
    for r in range(rounds):
        barrier.wait()  # go
        barrier.wait()  # both wrote
        sets, mix, stag = check_dir(folder)
        mixed += mix
        staging += stag
        [name] = [e for e in os.listdir(folder) if not e.startswith(".")]
        with open(os.path.join(folder, name, "report.json"), encoding="utf-8") as f:
            winners[json.load(f)["command"].split()[0]] += 1
        barrier.wait()
    for p in procs:
        p.join()
    os.unlink(blob)
    return {"rounds": rounds, "mixed sets": mixed, "staging folders after a round": staging,
            "last writer A/B": dict(winners), "exit codes": [p.exitcode for p in procs],
            "seconds": round(time.monotonic() - t, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--interrupts", type=int, default=200)
    ap.add_argument("--writers", type=int, default=200)
    ap.add_argument("--seed", type=int, default=22)
    args = ap.parse_args()
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = {}
    if args.writers:
        out["writers"] = writers(args.writers)
        print(json.dumps(out["writers"]), file=sys.stderr, flush=True)
    if args.interrupts:
        out["interrupts"] = interrupts(args.interrupts, random.Random(args.seed), env)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
