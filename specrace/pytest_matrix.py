"""The mutation matrix and the state-machine soak as pytest items, so pytest-xdist spreads
them over cores, GPUs (one per worker: ``specrace.pytest_plugin`` pins them) and hosts.

``pytest --specrace-matrix`` collects one item per matrix cell -- ``matrix.run.
matrix_cells``, the cells ``specrace matrix`` runs -- for ``--specrace-target`` on
``--specrace-backend``; ``--specrace-soak N`` collects N seeded runs of each state machine.
Either replaces the test suite's collection. A cell item fails under the CLI's rule (a
mutation not killed, a finding on the fixed code, a harness error, a timeout); its row
travels to the controlling process in the report's ``user_properties``, and the session
ends with the same kill table ``specrace matrix`` prints (``format_matrix``), optionally
as JSON (``--specrace-matrix-json PATH``).

Soak items share Hypothesis' example database: a directory under the rootdir's
``.hypothesis``, which every worker of this host uses; all seeds of one machine share its
key, so an example one item saved is replayed first by each item that starts after.

Imported lazily by the plugin (only when one of the options is given): scenarios and
torch load after the worker's GPU pinning.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from seams.vocab import Backend

ROW_PROPERTY = "specrace_matrix_row"  # user_properties key carrying a cell's row


class CellFailed(Exception):
    """A matrix cell that fails the gate (its one-line reason)."""


class MatrixItem(pytest.Item):
    """One matrix cell: the fixed code against a probe, or a seeded bug against its
    probes."""

    def __init__(self, *, cell: Tuple[str, str], order: int, backend: str, target: str,
                 **kw) -> None:
        super().__init__(**kw)
        self.cell, self.order, self.backend, self.target = cell, order, backend, target

    def runtest(self) -> None:
        from matrix.run import run_cell, run_isolated
        from matrix.table import cell_failed
        if self.backend == Backend.CUDA:  # a killed mutation may poison the process's CUDA context
            row = run_isolated([self.cell], self.backend, self.target)[0]
        else:
            row = run_cell(self.cell, self.backend, self.target)
        self.user_properties.append(
            (ROW_PROPERTY, json.dumps({"cell": list(self.cell), "order": self.order,
                                       "backend": self.backend, "row": row}, default=str)))
        if cell_failed(self.cell, row):
            kind, name = self.cell
            what = (row.get("finding") if kind == "probe" else row.get("detail")) or ""
            raise CellFailed(f"{kind} {name}: {row['status']}" + (f": {what}" if what else ""))

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, CellFailed):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"specrace matrix {self.target}/{self.backend}: {self.name}"


def example_database(rootdir: Path):
    """The Hypothesis example database every worker of this host shares (rootdir-based,
    so it does not depend on the directory pytest was started from)."""
    from hypothesis.database import DirectoryBasedExampleDatabase
    return DirectoryBasedExampleDatabase(str(Path(rootdir) / ".hypothesis" / "examples"))


SOAK_EXAMPLES = 10  # programs per soak item
SOAK_STEPS = 25  # rules per program


def soak_machines() -> Dict[str, type]:
    """The state machines a soak runs: the engine with the pool sizes of ``POOL_SIZES``,
    with pools that always wrap around, and with constrained (grammar) requests."""
    from specrace.machines import EngineMachine, GrammarEngineMachine, SmallPoolEngineMachine
    return {"engine": EngineMachine, "small-pool": SmallPoolEngineMachine,
            "grammar": GrammarEngineMachine}


def seeded_machine(machine: type, seed: int):
    """A factory for ``machine`` that Hypothesis runs from ``seed``; every seed of one
    machine has the same example-database key (the machine's name), so a failing program
    saved by one seed's item is replayed by the others."""
    from hypothesis import seed as hypothesis_seed

    def make():
        return machine()

    # Hypothesis keys a state machine's examples by the factory's digest; this factory's
    # source is the same for every machine, so its name is added (Hypothesis' own hook
    # for telling parametrized tests apart).
    make._hypothesis_internal_add_digest = (  # type: ignore[attr-defined]
        f"{machine.__module__}.{machine.__qualname__}".encode())
    return hypothesis_seed(seed)(make)


def run_soak(machine: type, seed: int, database, **overrides) -> None:
    """``SOAK_EXAMPLES`` programs of ``machine`` from ``seed``, examples kept in
    ``database``; raises with the shrunk program on a failure."""
    from hypothesis import HealthCheck, settings
    from hypothesis.stateful import run_state_machine_as_test
    run_state_machine_as_test(seeded_machine(machine, seed), settings=settings(
        **{**dict(max_examples=SOAK_EXAMPLES, stateful_step_count=SOAK_STEPS, deadline=None,
                  suppress_health_check=list(HealthCheck), database=database,
                  derandomize=False, report_multiple_bugs=False), **overrides}))


class SoakItem(pytest.Item):
    """One seeded run of a state machine: ``SOAK_EXAMPLES`` programs, fails with the
    shrunk program Hypothesis prints."""

    def __init__(self, *, machine: str, seed: int, target: str, **kw) -> None:
        super().__init__(**kw)
        self.machine, self.seed, self.target = machine, seed, target

    def runtest(self) -> None:
        # the machines read the target from $SPECRACE_TARGET, which the plugin exported
        examples = self.config.getoption("--specrace-soak-examples") or SOAK_EXAMPLES
        run_soak(soak_machines()[self.machine], self.seed,
                 example_database(self.config.rootpath), max_examples=examples)

    def reportinfo(self):
        return self.path, None, f"specrace soak {self.target}: {self.name}"


# ---------------------------------------------------------------------------------------
# Collection and the session's table (called from the plugin's hooks)

def make_items(session: pytest.Session, target: str) -> List[pytest.Item]:
    """The matrix cells and soak runs the options ask for, in table order."""
    import targets
    from harness.runtime import BackendError, resolve_backend
    config = session.config
    try:
        targets.get(target)
        backend = resolve_backend(config.getoption("--specrace-backend"))
    except (targets.TargetError, BackendError) as exc:
        raise pytest.UsageError(str(exc)) from None
    items: List[pytest.Item] = []
    if config.getoption("--specrace-matrix"):
        from matrix.run import matrix_cells
        for order, (kind, name) in enumerate(matrix_cells(target)):
            items.append(MatrixItem.from_parent(
                session, name=f"matrix[{target}-{backend}]::{kind}:{name}",
                cell=(kind, name), order=order, backend=backend, target=target))
    for seed in range(config.getoption("--specrace-soak") or 0):
        for machine in soak_machines():
            items.append(SoakItem.from_parent(
                session, name=f"soak[{target}]::{machine}:{seed}", machine=machine,
                seed=seed, target=target))
    return items


class MatrixSession:
    """A plugin for the session (in the controlling process under xdist): keeps each
    cell's row from its report and prints the kill table at the end."""

    def __init__(self, config: pytest.Config, target: str) -> None:
        self.config, self.target = config, target
        self.rows: List[dict] = []  # as the items sent them: cell, order, backend, row
        self.started = time.perf_counter()

    def pytest_sessionstart(self, session) -> None:
        self.started = time.perf_counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == ROW_PROPERTY:
                self.rows.append(json.loads(value))

    def result(self) -> Optional[dict]:
        """The matrix result over the cells that ran, in table order (None: none ran)."""
        if not self.rows:
            return None
        from matrix.table import assemble  # no torch in this process
        rows = sorted(self.rows, key=lambda m: m["order"])  # table order, as collected
        return assemble(rows[0]["backend"], self.target,
                        [(m["cell"][0], m["cell"][1]) for m in rows],
                        [m["row"] for m in rows], time.perf_counter() - self.started)

    def pytest_terminal_summary(self, terminalreporter) -> None:
        summary(self.config, terminalreporter, self.result())


def summary(config: pytest.Config, terminalreporter, res: Optional[dict]) -> None:
    """The kill table (and the one-line problem summary) at the end of the session."""
    if res is None:
        return
    from matrix.table import format_matrix, problem_line
    from seams.text import printable
    terminalreporter.write_sep("=", "specrace mutation matrix")
    terminalreporter.write_line(printable(format_matrix(res), keep_newlines=True))
    problem = problem_line(res)
    if problem is not None:
        terminalreporter.write_line(printable(problem))
    path = config.getoption("--specrace-matrix-json")
    if path:
        try:
            Path(path).write_text(json.dumps(res, default=str))
        except OSError as exc:  # checked writable at configure: it went away since
            terminalreporter.write_line(f"specrace: cannot write --specrace-matrix-json: "
                                        f"{exc.strerror or exc}", red=True)
