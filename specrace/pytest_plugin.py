"""specrace's pytest plugin (entry point ``pytest11: specrace``; ``tests/conftest.py`` loads
it from a source tree that is not pip-installed).

* ``--specrace-backend {sim,cuda,auto}`` (default ``auto``: cuda when a GPU is present);
* ``--specrace-target {impl,sglang}``: the code under test (``specrace_target`` fixture;
  exported as ``$SPECRACE_TARGET`` for the Hypothesis state machines);
* the ``cuda`` marker: such tests are skipped, with a reason, when no GPU is available (or
  when ``--specrace-backend sim`` is chosen);
* fixtures: ``specrace_backend`` (the resolved name), ``specrace_runtime`` (an open
  runtime), ``scenario_runner`` (``run_scenario(name, **kw)``), ``specrace_report``
  (``.attach(path)``: a failing test's report shows "specrace report: PATH"),
  ``specrace_audit`` (``specrace audit`` of the installed server, for a server's own suite:
  ``specrace.pytest_audit``);
* ``--specrace-matrix`` / ``--specrace-soak N``: instead of the tests, the mutation
  matrix's cells / N seeded runs of each state machine as items (``specrace.pytest_matrix``),
  for pytest-xdist to spread; the session ends with the matrix's kill table
  (``--specrace-matrix-json PATH`` also writes it as JSON);
* under pytest-xdist on a machine with several GPUs each worker pins itself to one GPU
  (``CUDA_VISIBLE_DEVICES`` from the worker id), before anything initialises CUDA -- unless
  the user already set ``CUDA_VISIBLE_DEVICES``.

This module must not import torch at import time: the worker pinning has to happen first.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from typing import Any, List, Optional

import pytest
from seams.vocab import Backend, TargetName

BACKENDS = ("sim", "cuda", "auto")
TARGETS = tuple(t.value for t in TargetName)
TARGET_ENV = "SPECRACE_TARGET"  # what state machines read (set from --specrace-target)
WATCHDOG_ENV = "SPECRACE_TEST_WATCHDOG_S"  # per-test limit for CUDA runtimes (0: off)
BACKEND_ENV = "SPECRACE_BACKEND"  # the state machines' backend (sim, cuda or auto)
DEFAULT_WATCHDOG_S = 300.0

_REPORTS = pytest.StashKey[List[str]]()


# ---------------------------------------------------------------------------------------
# Worker -> GPU (pure, tested without a GPU)

_WORKER_RE = re.compile(r"^gw(\d+)$")


def gpu_for_worker(worker_id: str, count: int) -> Optional[int]:
    """The GPU index an xdist worker (``gw0``, ``gw1``, ...) takes among ``count`` GPUs;
    None when the id is not an xdist worker id or there is no GPU."""
    if not worker_id or count is None or count <= 0:
        return None
    m = _WORKER_RE.match(worker_id.strip())
    if m is None:
        return None
    return int(m.group(1)) % count


def parse_nvidia_smi_list(text: str) -> Optional[int]:
    """GPU count from ``nvidia-smi -L`` output; None when MIG devices are listed (their
    ``CUDA_VISIBLE_DEVICES`` indexing differs: leave the choice to the user)."""
    gpus = 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("MIG "):
            return None
        if s.startswith("GPU "):
            gpus += 1
    return gpus


def count_gpus_without_cuda() -> Optional[int]:
    """Count GPUs without initialising CUDA in this process (``nvidia-smi -L``)."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    return parse_nvidia_smi_list(proc.stdout)


def _pin_worker_gpu() -> Optional[int]:
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker or "CUDA_VISIBLE_DEVICES" in os.environ:
        return None
    count = count_gpus_without_cuda()
    if not count:
        return None  # unknown (no nvidia-smi, MIG) or none: leave it alone
    gpu = gpu_for_worker(worker, count)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        os.environ["SPECRACE_WORKER_GPU"] = str(gpu)
    return gpu


def _share_cores() -> None:
    """An xdist worker takes its share of the cores for torch's intra-op threads (a user's
    ``OMP_NUM_THREADS`` wins): N workers each running a full-width thread pool
    oversubscribe the machine, and the idle threads' spinning costs more than the
    simulator's small tensors gain (the CPU suite on 2 cores: 120 s -> 89 s). The
    variable also reaches the CLI processes the tests start; a torch this worker has
    already loaded is told directly."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if workers and workers.isdigit() and int(workers) > 0:
        share = max(1, (os.cpu_count() or 1) // int(workers))
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        threads = os.environ["OMP_NUM_THREADS"]
        torch = sys.modules.get("torch")
        if torch is not None and threads.isdigit() and int(threads) > 0:
            torch.set_num_threads(int(threads))


# ---------------------------------------------------------------------------------------
# Hooks

def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("specrace")
    group.addoption("--specrace-backend", action="store", default="auto", choices=BACKENDS,
                    help="device backend for specrace tests: sim, cuda or auto (default: "
                         "cuda when a GPU is available, else sim)")
    group.addoption("--specrace-target", action="store", default=None, choices=TARGETS,
                    help="the code under test for target-aware tests and state machines: "
                         "impl (specrace's mirror, default) or sglang (the installed "
                         "package)")
    group.addoption("--specrace-matrix", action="store_true", default=False,
                    help="collect the mutation matrix's cells (for --specrace-target on "
                         "--specrace-backend) as items instead of the tests; the session "
                         "ends with the kill table `specrace matrix` prints")
    group.addoption("--specrace-soak", action="store", type=int, default=0, metavar="N",
                    help="collect N seeded runs of each Hypothesis state machine as items "
                         "instead of the tests")
    group.addoption("--specrace-soak-examples", action="store", type=int, default=None,
                    metavar="K", help="programs per soak item (default 10)")
    group.addoption("--specrace-matrix-json", action="store", default=None, metavar="PATH",
                    help="with --specrace-matrix: also write the kill table as JSON")


MAX_SOAK = 10_000  # seeded runs of each machine one session may ask for
MAX_SOAK_EXAMPLES = 100_000  # programs per soak item


def check_options(config: Any) -> None:
    """The specrace options, checked before anything is collected or run
    (``pytest.UsageError``: pytest's one-line usage error, exit 4): a soak count or a
    program count out of range, a matrix JSON path that cannot be written (found out up
    front, not after every cell ran)."""
    _check_settings()
    soak = config.getoption("--specrace-soak", default=0) or 0
    if not 0 <= soak <= MAX_SOAK:
        raise pytest.UsageError(f"--specrace-soak: {soak} is out of range (0..{MAX_SOAK})")
    examples = config.getoption("--specrace-soak-examples", default=None)
    if examples is not None and not 1 <= examples <= MAX_SOAK_EXAMPLES:
        raise pytest.UsageError(f"--specrace-soak-examples: {examples} is out of range "
                                f"(1..{MAX_SOAK_EXAMPLES})")
    path = config.getoption("--specrace-matrix-json", default=None)
    if path is not None:
        if not config.getoption("--specrace-matrix", default=False):
            raise pytest.UsageError("--specrace-matrix-json needs --specrace-matrix")
        _check_writable(path)


def _check_settings() -> None:
    """The environment's SPECRACE_* settings the suite reads, checked before collection:
    a bad one is a usage error naming it, never a failure inside a test (the state
    machines read the target and backend from the environment)."""
    from harness.runtime.limits import LimitError, check_environment, seconds_from_env
    for name, allowed in ((TARGET_ENV, TARGETS), (BACKEND_ENV, BACKENDS)):
        value = os.environ.get(name)
        if value is not None and value not in allowed:
            raise pytest.UsageError(f"{name}={value[:40]!r} is not one of: "
                                    f"{', '.join(allowed)}")
    try:
        check_environment()
        seconds_from_env(WATCHDOG_ENV, DEFAULT_WATCHDOG_S)
    except LimitError as exc:
        raise pytest.UsageError(str(exc)) from None


def _watchdog_s() -> float:
    """The per-test limit for CUDA runtimes (checked at configure: ``_check_settings``)."""
    from harness.runtime.limits import seconds_from_env
    return seconds_from_env(WATCHDOG_ENV, DEFAULT_WATCHDOG_S)


def _check_writable(path: str) -> None:
    from seams.text import echo
    shown = echo(path, 120)
    if os.path.isdir(path):
        raise pytest.UsageError(f"--specrace-matrix-json: {shown} is a directory")
    existed = os.path.exists(path)
    try:
        with open(path, "a"):  # appends nothing; created now, it is removed again
            pass
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        raise pytest.UsageError(f"--specrace-matrix-json: cannot write {shown}: {reason}"
                                ) from None
    if not existed:
        os.unlink(path)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    _pin_worker_gpu()  # first: before any plugin or test module can initialise CUDA
    check_options(config)
    _share_cores()
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU (auto-skipped without one)")
    config.addinivalue_line("markers", "cuda_isolated: a cuda test that provokes a sticky "
                                       "CUDA error: it runs in a fresh process")
    target = config.getoption("--specrace-target", default=None)
    if target:  # xdist workers inherit it; state machines are not fixtures
        os.environ[TARGET_ENV] = target
    if _matrix_session(config):  # collects the cells' rows, prints the kill table
        from specrace.pytest_matrix import MatrixSession
        config.pluginmanager.register(MatrixSession(config, _target(config)),
                                      "specrace-matrix-session")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _target(config: pytest.Config) -> str:
    return config.getoption("--specrace-target") or os.environ.get(TARGET_ENV, "impl")


def _matrix_session(config: pytest.Config) -> bool:
    return bool(config.getoption("--specrace-matrix", default=False)
                or config.getoption("--specrace-soak", default=0))


def pytest_ignore_collect(collection_path, config: pytest.Config) -> Optional[bool]:
    """A matrix/soak session collects its own items (``pytest_collection_modifyitems``),
    not the test files."""
    return True if _matrix_session(config) else None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config,
                                  items: List[pytest.Item]) -> None:
    if _matrix_session(config):
        from specrace import pytest_matrix
        items[:] = pytest_matrix.make_items(session, _target(config))
        # counted as collected (the terminal's "collected N items"), as a collector's are
        config.hook.pytest_collectreport(report=pytest.CollectReport(
            session.nodeid, "passed", None, list(items)))
    _skip_cuda_items(config, items)


def _skip_cuda_items(config: pytest.Config, items: List[pytest.Item]) -> None:
    cuda_items = [it for it in items if it.get_closest_marker("cuda") is not None
                  or it.get_closest_marker("cuda_isolated") is not None]
    if not cuda_items:
        return
    backend = config.getoption("--specrace-backend")
    if backend == Backend.SIM:
        reason = "cuda test: --specrace-backend sim was chosen"
    elif not _cuda_available():
        reason = "cuda test: no CUDA GPU is available on this machine"
    else:
        return
    skip = pytest.mark.skip(reason=reason)
    for it in cuda_items:
        it.add_marker(skip)


_CHILD_ENV = "SPECRACE_ISOLATED_CHILD"


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Optional[bool]:
    """A ``cuda_isolated`` test runs in a fresh process of its own.

    CUDA errors are sticky: a test that provokes one on purpose (a device-side assert)
    poisons its process, and a GPU test must not inherit a process another has poisoned.
    Every other ``cuda`` test runs in the worker's own process (several traced runs in
    one process are fine). The child runs exactly this test id; its outcome and output
    become this test's.
    """
    if pyfuncitem.get_closest_marker("cuda_isolated") is None or os.environ.get(_CHILD_ENV):
        return None
    import sys
    env = {**os.environ, _CHILD_ENV: "1"}
    root = str(pyfuncitem.config.rootpath)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
         "-x", pyfuncitem.nodeid], cwd=root, env=env, capture_output=True, text=True,
        timeout=_watchdog_s() + 60)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        pytest.fail(f"isolated CUDA test failed (rc {proc.returncode}):\n{tail}",
                    pytrace=False)
    return True


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.failed:
        paths = item.stash.get(_REPORTS, None)
        if paths:
            rep.sections.append(("specrace", "\n".join(f"specrace report: {p}"
                                                       for p in paths)))
    return rep


# ---------------------------------------------------------------------------------------
# Fixtures

from specrace.pytest_audit import specrace_audit  # noqa: E402,F401 -- registered here

@pytest.fixture(scope="session")
def specrace_backend(pytestconfig: pytest.Config) -> str:
    """The resolved backend name ("sim" or "cuda")."""
    from harness.runtime import BackendError, resolve_backend
    try:
        return resolve_backend(pytestconfig.getoption("--specrace-backend"))
    except BackendError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def specrace_target(pytestconfig: pytest.Config) -> str:
    """The target under test ("impl" or "sglang"), loaded and checked; a target that cannot
    run here fails the test with its one-line reason."""
    import targets
    name = pytestconfig.getoption("--specrace-target") or os.environ.get(TARGET_ENV, "impl")
    try:
        targets.get(name)
    except targets.TargetError as exc:
        pytest.fail(str(exc), pytrace=False)
    return name


@pytest.fixture
def specrace_runtime(specrace_backend: str):
    """An open runtime on the chosen backend (traced); a watchdog guards CUDA runs."""
    from harness.runtime import open_runtime
    if specrace_backend == Backend.CUDA:
        from harness.runtime.cuda import watchdog
        limit = _watchdog_s()
        with watchdog(limit, "specrace_runtime test"), open_runtime(specrace_backend) as rt:
            yield rt
    else:
        with open_runtime(specrace_backend) as rt:
            yield rt


class SpecraceReport:
    """Collects report paths; a failing test shows them in its failure sections."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    @property
    def paths(self) -> List[str]:
        return list(self._item.stash.get(_REPORTS, []))

    def attach(self, path: Any) -> None:
        paths = self._item.stash.setdefault(_REPORTS, [])
        p = os.fspath(path)
        if p not in paths:
            paths.append(p)


@pytest.fixture
def specrace_report(request: pytest.FixtureRequest) -> SpecraceReport:
    return SpecraceReport(request.node)


@pytest.fixture
def scenario_runner(specrace_backend: str, pytestconfig: pytest.Config):
    """``run(name, variant=..., war_barrier=..., trials=..., expect=...)`` -> the repro
    result dict (as ``specrace repro --json``), on the chosen backend and target unless
    ``backend=`` / ``target=`` is given. Assert on ``result["outcome"]`` /
    ``result["matches_expectation"]``."""
    from scenarios.resolve import run_scenario
    target = pytestconfig.getoption("--specrace-target") or os.environ.get(TARGET_ENV, "impl")

    def run(name: str, **kw: Any) -> Any:
        kw.setdefault("backend", specrace_backend)
        kw.setdefault("target", target)
        return run_scenario(name, **kw)

    return run
