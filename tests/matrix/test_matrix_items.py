"""``pytest --specrace-matrix`` (specrace/pytest_matrix.py): the matrix's cells as pytest
items, spread by pytest-xdist, end in the same kill table ``specrace matrix`` prints; an
item fails exactly where the CLI's gate does (a mutation that survives). The soak's
seeded state-machine runs are items too, sharing one example database."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import Phase
from hypothesis.database import InMemoryExampleDatabase

import matrix.run as mx
from specrace.machines import EngineMachine
from specrace.pytest_matrix import example_database, run_soak, soak_machines
from mutations import BY_NAME

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "plugin_fixtures"


def _plugin_args() -> list:
    """``-p specrace.pytest_plugin`` where specrace is not installed (its ``pytest11`` entry
    point absent: a checkout on PYTHONPATH, as on the GPU machine), since a pytest started
    outside ``tests/`` never reads the conftest that would load it."""
    from importlib.metadata import entry_points
    installed = any(ep.value == "specrace.pytest_plugin"
                    for ep in entry_points(group="pytest11"))
    return [] if installed else ["-p", "specrace.pytest_plugin"]


def _pytest(*args, cwd=ROOT):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(FIXTURES), str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:randomly",
                           *_plugin_args(), *args],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def _untimed(table: str) -> str:
    """The kill table without its timings (they differ between runs)."""
    table = re.sub(r", [\d.]+ s$", "", table, flags=re.M)
    return re.sub(r"\s+[\d.]+s$", "", table, flags=re.M)


def test_pytest_items_and_the_cli_agree_on_the_kill_table(tmp_path, monkeypatch):
    out = tmp_path / "matrix.json"
    proc = _pytest("--specrace-matrix", "--specrace-backend", "sim", "-p", "small_matrix",
                   "-n", "2", "--specrace-matrix-json", str(out))
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the harmless one survives
    # one item per cell; only the survivor fails
    assert "4 items" in proc.stdout and "1 failed, 3 passed" in proc.stdout, proc.stdout
    assert re.search(r"FAILED .*mutation:finish-flag-spelled-differently", proc.stdout)
    items = json.loads(out.read_text())

    from tests.plugin_fixtures.small_matrix import shrink
    shrink(monkeypatch.setattr)
    cli = mx.run_matrix("sim")  # what `specrace matrix` computes and prints

    assert _untimed(mx.format_matrix(items)) == _untimed(mx.format_matrix(cli))
    assert _untimed(mx.format_matrix(cli)) in _untimed(proc.stdout)  # printed at the end
    assert mx.matrix_ok(items) is mx.matrix_ok(cli) is False
    assert [r["status"] for r in items["mutations"]] == ["killed", "survived"]
    assert mx.problem_line(items) in proc.stdout


class _SlotBug(EngineMachine):
    mutation = BY_NAME["slot-released-twice"]


def test_soak_seeds_share_the_database_key_and_replay_a_saved_failure():
    """What one seed's item found is replayed by another seed's item: with generation off,
    seed 1 can fail only by replaying seed 0's saved program."""
    db = InMemoryExampleDatabase()
    with pytest.raises(AssertionError):
        run_soak(_SlotBug, 0, db, max_examples=30, phases=[Phase.generate])
    keys = set(db.data)
    assert keys
    with pytest.raises(AssertionError):
        run_soak(_SlotBug, 1, db, phases=[Phase.reuse])
    assert set(db.data) == keys  # one machine, one key, whatever the seed
    run_soak(EngineMachine, 1, db, max_examples=1)  # another machine: nothing to replay


def test_soak_items_run_on_workers_and_use_the_rootdirs_database(tmp_path):
    """``--specrace-soak 1``: one seeded run of each machine as an item (on two workers);
    the database is the rootdir's, whatever directory pytest started in."""
    proc = _pytest("--specrace-soak", "1", "--specrace-soak-examples", "2",
                   "--specrace-backend", "sim", "-n", "2",
                   f"--rootdir={ROOT}", "-c", str(ROOT / "pyproject.toml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(soak_machines())} passed" in proc.stdout, proc.stdout
    assert f"[{len(soak_machines())} items]" in proc.stdout, proc.stdout
    assert not (tmp_path / ".hypothesis" / "examples").exists()
    assert example_database(ROOT).path == ROOT / ".hypothesis" / "examples"
