"""The report sets committed under ``reports/``: regenerate them, or check that each still
replays with its recorded verdict.

    python tools/reports/committed.py check        # `make check-reports` (CI)
    python tools/reports/committed.py regenerate   # `make example-reports`
    python tools/reports/committed.py regenerate reports/.../report.json ...  # just those

``check`` replays every committed simulator report (``specrace replay``: the same verdict,
the same trace) and loads every CUDA report (validated; replaying one needs a GPU: the H200
scripts under tools/gpu/ do that); any report that does not replay identically fails it.
``regenerate`` re-runs each simulator report's own recorded command (its ``command``
field) into the folder it lies in and removes the old set when the new one has another
name (the name carries a digest of the run's settings, the code's too). A report of a
release the core does not import replays in that release's environment (``specrace
replay`` does it); one whose release is not set up here is named, and fails ``check``.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SPECRACE = [sys.executable, "-m", "specrace.cli"]


def committed() -> List[Tuple[str, dict]]:
    """(path, document) of every report.json git tracks under reports/."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "reports"], capture_output=True,
                         text=True, check=True).stdout.split()
    found = []
    for rel in sorted(p for p in out if p.endswith("/report.json")):
        path = os.path.join(ROOT, rel)
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                found.append((path, json.load(f)))
    return found


def _check_one(path: str, doc: dict) -> Tuple[bool, str]:
    """(replays as recorded, the line that says so) for one committed report."""
    rel = os.path.relpath(path, ROOT)
    if doc.get("backend") != "sim":
        # validated by loading it; a fresh GPU sample is the H200 scripts' to take
        proc = subprocess.run([*SPECRACE, "replay", path, "--max-trials", "1"],
                              capture_output=True, text=True, cwd=ROOT)
        ok = "asks for" in proc.stderr or "recorded on cuda" in proc.stderr
        return ok, (f"ok   {rel}: valid (a CUDA report: replayed on a GPU only)" if ok
                    else f"BAD  {rel}: {proc.stderr.strip()[-300:]}")
    proc = subprocess.run([*SPECRACE, "replay", path], capture_output=True, text=True,
                          cwd=ROOT)
    line = (proc.stdout.strip().splitlines() or proc.stderr.strip().splitlines()
            or [f"exit {proc.returncode}"])[-1]
    ok = proc.returncode == 0 and "DIFFERENT" not in line
    return ok, f"{'ok  ' if ok else 'BAD '} {rel}: {line}"


def check() -> int:
    # each replay is a child of one process at a time: one per core (CI has two), the
    # lines printed in the reports' order
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        results = list(pool.map(lambda pd: _check_one(*pd), committed()))
    for _, line in results:
        print(line)
    bad = sum(not ok for ok, _ in results)
    print(f"{bad} committed report(s) do not replay with their verdict" if bad
          else "every committed report replays with its verdict")
    return 1 if bad else 0


def _interpreter(path: str) -> List[str]:
    """``specrace`` as the report's release runs it: this interpreter, or that of the
    release's environment when the core does not have the report's release (vLLM)."""
    from specrace.replay import load_report, release_python
    python = release_python(load_report(path))
    return SPECRACE if python is None else [python, "-m", "specrace.cli"]


def regenerate(only: List[str]) -> int:
    """Re-run the recorded command of every simulator report, or of those named in ``only``
    (after an edit that moved lines one report points at, the rest need not run again)."""
    wanted = {os.path.realpath(p) for p in only}
    for path, doc in committed():
        if doc.get("backend") != "sim" or (wanted and os.path.realpath(path) not in wanted):
            continue
        folder = os.path.dirname(path)
        argv = shlex.split(doc["command"])
        assert argv[:2] == ["specrace", "repro"], doc["command"]
        if "--backend" not in argv:  # a simulator report stays one on a GPU machine
            argv += ["--backend", "sim"]
        before = set(os.listdir(os.path.dirname(folder)))
        print("+", doc["command"], flush=True)
        rc = subprocess.run([*_interpreter(path), *argv[1:]], cwd=ROOT).returncode
        if rc not in (0, 1):  # 1: a verdict other than --expect; the report is written
            print(f"failed ({rc}): {doc['command']}", file=sys.stderr)
            return rc
        after = set(os.listdir(os.path.dirname(folder)))
        if os.path.basename(folder) not in after - before and (after - before):
            shutil.rmtree(folder)  # the same run under its new name
    return 0


if __name__ == "__main__":
    what = sys.argv[1:] or ["check"]
    sys.exit(check() if what == ["check"] else regenerate(what[1:]) if what[0] == "regenerate"
             else 2)
