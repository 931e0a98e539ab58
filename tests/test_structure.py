"""The shape of the tree: no import cycles, the top-level rooms in one order (no folder pair
importing each other both ways), small modules, the code under test (toys/, impl/) behind
its doors, the harness's floors (target -> runtime -> detect -> policies ->
oracle/trials/run -> report) and each server target's sub-rooms in order, with no back
edges. Static (the import graph of ``tests/import_graph.py``: function-level imports and
``importlib.import_module("...")`` with a literal name included, so an import moved into a
function or spelt as a call does not hide a back edge): nothing is imported."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A module that needs more than this has more than one job: split it into rooms. (The
# number is a judgement, not a law: ~400 lines is what one reader holds in view.)
MAX_MODULE_LINES = 400

# Lower floors first: a layer may import the ones before it, never the ones after. The
# target interface (target.py) is the ground floor: every layer may drive a target, and it
# imports none of them. The judges (oracle/), the room that runs trials and calls them
# (trials/) and the resolved run those trials take (run.py, which carries the trials'
# identity) are one floor: the file-cycle test keeps them from importing each other in a
# circle. The Hypothesis state machines (specrace/machines/) drive trials: a room above.
# The fault hook and plan (seams/faults/) sit below every floor.
LAYERS = ("target", "runtime", "detect", "policies", ("oracle", "trials", "run"), "report")

# Each server target's sub-rooms, lower floors first, as they are: boundary/ (the
# version contract, stand-ins, platform, the server args) under everything; the release
# environments; sglang's runner/ (upstream's ModelRunner built) under the engine that
# calls it; engine/ (upstream's loop and the objects it drives); the slices and vLLM's
# Model Runner V2 (mrv2/) built on the engine's worker and loop. The package itself
# (``targets.sglang``: the Target) stands above its sub-rooms.
SUBROOMS = {"targets.sglang": ("boundary", "environments", "runner", "engine", "slices"),
            "targets.vllm": ("boundary", "environments", "engine", "mrv2", "slices")}

# The sub-room back edges the tree has today, each a dispatch or a table read upward (the
# contract reads the names its driven tables list, the engine picks a slice or Model
# Runner V2 when it builds). Owed a move; nothing may join this list, it may only shrink.
KNOWN_SUBROOM_BACK_EDGES = {
    ("targets.sglang.boundary.platform", "targets.sglang.slices.eagle_kernels"),
    ("targets.sglang.engine.scheduler_object", "targets.sglang.slices"),
    ("targets.sglang.engine.scheduler_object", "targets.sglang.slices.dspark"),
    ("targets.sglang.engine.scheduler_object", "targets.sglang.slices.eagle"),
    ("targets.vllm.boundary.contract", "targets.vllm.engine.kernels"),
    ("targets.vllm.boundary.contract", "targets.vllm.mrv2"),
    ("targets.vllm.boundary.contract", "targets.vllm.mrv2.table"),
    ("targets.vllm.boundary.surface", "targets.vllm.mrv2"),
    ("targets.vllm.boundary.surface", "targets.vllm.mrv2.table"),
    ("targets.vllm.engine.loop", "targets.vllm.mrv2"),
    ("targets.vllm.engine.loop", "targets.vllm.mrv2.grammar"),
    ("targets.vllm.engine.loop", "targets.vllm.mrv2.model"),
    ("targets.vllm.engine.loop", "targets.vllm.mrv2.runner"),
}

# The top-level rooms, ground floor first: a room may import the rooms before it, never one
# after. seams/ holds what every room uses (fault points, run context, permanent process
# changes, source patching, signals, text); toys/ is the toy world every target runs on
# (the bigram model, paged attention and pools, the kernel stand-ins); impl/ is the mirror
# target; specrace/ is the front door (CLI, pytest plugin, bench, replay, state machines).
ROOMS = ("seams", "toys", "impl", "mutations", "harness", "targets", "scenarios", "litmus",
         "matrix", "specrace")
# tools/ (the GPU bundles and scripts, the report builders, the measurements) is no room:
# it drives them all and none imports it -- it stands above the top floor, and the graph
# covers it so that this holds.
ABOVE_ROOMS = "tools"

# What the code under test may import outside its own room: the fault-point / observe
# hooks and the words of a run (its server args' relays, fences, platforms), and the
# mirror the toy world it runs on -- so a run of either is the same code whether the
# harness drives it or not.
DOORS = {"toys": ("seams.faults", "seams.vocab"),
         "impl": ("seams.faults", "seams.vocab", "toys")}


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph",
                                                  ROOT / "tests" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def graph():
    return _tool().import_graph(str(ROOT))


def _floor(module: str, package: str, floors):
    """The floor of ``module`` among ``package``'s ``floors`` (its sub-room or module
    directly under ``package``; a tuple is one floor), or None: not below ``package``, or
    the package itself."""
    if not module.startswith(package + "."):
        return None
    room = module[len(package) + 1:].split(".")[0]
    return next((i for i, floor in enumerate(floors)
                 if room == floor or (isinstance(floor, tuple) and room in floor)), None)


def _back_edges(graph, package: str, floors) -> set:
    """The imports inside ``package`` that go up its ``floors``."""
    return {(m, d) for m, deps in graph.items()
            if (low := _floor(m, package, floors)) is not None
            for d in deps if (high := _floor(d, package, floors)) is not None and high > low}


def _unplaced(graph, package: str, floors) -> set:
    """Modules below ``package`` on none of its floors (a new sub-room must be placed)."""
    return {m for m in graph if m.startswith(package + ".")
            and _floor(m, package, floors) is None}


def test_no_import_cycle(graph):
    assert _tool().cycles(graph) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _tool().cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# Modules over the limit that are known and owed a split: a table of litmus
# programs. Nothing may join this list; it may only shrink.
OVER_LIMIT: set = set()


def test_no_module_is_too_long():
    long = {str(p.relative_to(ROOT)): n
            for top in (*ROOMS, ABOVE_ROOMS)
            for p in (ROOT / top).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert set(long) <= OVER_LIMIT, long


def _room(module: str) -> int:
    top = module.split(".")[0]
    return len(ROOMS) if top == ABOVE_ROOMS else ROOMS.index(top)


def test_rooms_import_only_downwards(graph):
    """Every import, at module level or inside a function, runs down the floors."""
    back = {(m, d) for m, deps in graph.items() for d in deps if _room(d) > _room(m)}
    assert back == set(), back
    assert set(graph) and all(m.split(".")[0] in (*ROOMS, ABOVE_ROOMS) for m in graph)
    assert any(m.startswith(ABOVE_ROOMS + ".") for m in graph)  # tools/ is read


def _both_ways(graph) -> set:
    pairs = {(m.split(".")[0], d.split(".")[0]) for m, deps in graph.items() for d in deps}
    return {(a, b) for a, b in pairs if a < b and (b, a) in pairs}


def test_no_two_rooms_import_each_other(graph):
    assert _both_ways(graph) == set()


def test_the_pair_check_catches_two_rooms_importing_each_other():
    fake = {"harness.trials": {"targets"}, "targets": {"harness.target"}}
    assert _both_ways(fake) == {("harness", "targets")}


def test_the_room_checks_catch_a_back_edge():
    fake = {"seams.faults": {"harness.trials"}, "harness.trials": {"seams.faults"}}
    assert {(m, d) for m, deps in fake.items() for d in deps if _room(d) > _room(m)} == {
        ("seams.faults", "harness.trials")}


def _through_doors(graph, room: str) -> set:
    """The imports out of ``room`` that pass none of its doors (``DOORS``)."""
    doors = DOORS[room]
    return {(m, d) for m, deps in graph.items() if m.split(".")[0] == room
            for d in deps if d.split(".")[0] != room
            and not any(d == door or d.startswith(door + ".") for door in doors)}


@pytest.mark.parametrize("room", sorted(DOORS))
def test_the_code_under_test_imports_only_through_its_doors(graph, room):
    assert _through_doors(graph, room) == set()
    assert any(d.startswith(DOORS[room]) for m, deps in graph.items()
               if m.startswith(room) for d in deps)


def test_the_door_check_catches_the_mirror_reaching_into_the_harness():
    fake = {"impl.worker": {"toys.verify", "seams.faults", "harness.oracle.stale"},
            "toys.verify": {"seams.faults", "seams.context"}}
    assert _through_doors(fake, "impl") == {("impl.worker", "harness.oracle.stale")}
    assert _through_doors(fake, "toys") == {("toys.verify", "seams.context")}


def test_harness_layers_have_no_back_edges(graph):
    assert _back_edges(graph, "harness", LAYERS) == set()
    assert _unplaced(graph, "harness", LAYERS) == set()
    # the hooks below every layer import none of them
    for base in ("seams.faults", "seams.context"):
        assert {d for d in graph[base] if d.startswith("harness")} <= {"seams.context"}


def _literal_first_args(func: str, tops) -> set:
    """The string literals passed first to calls of the bare name ``func`` under ``tops``."""
    import ast
    found = set()
    for top in tops:
        for path in (ROOT / top).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == func
                        and node.args and isinstance(node.args[0], ast.Constant)):
                    found.add(node.args[0].value)
    return found


def test_every_fault_point_the_code_marks_is_a_named_one():
    """A stall point is a name in ``seams.faults.FAULT_POINTS``: a misspelt point in the
    code would never fire a stall, so every ``fault_point("...")`` call is checked here,
    and a plan naming an unknown point fails when it is made."""
    import pytest

    from seams.faults import ASK_POINTS, FAULT_POINTS
    from seams.faults.plan import FaultPlan, StallAt
    marked = _literal_first_args("fault_point", ROOMS)
    assert marked and marked <= set(FAULT_POINTS), marked - set(FAULT_POINTS)
    with pytest.raises(ValueError, match="unknown fault point"):
        StallAt("forward.after_readdone", None)
    asked = _literal_first_args("ask", ("toys", "impl", "targets"))
    assert asked and asked <= set(ASK_POINTS), asked - set(ASK_POINTS)
    with pytest.raises(ValueError, match="unknown host-order question"):
        FaultPlan(answers={"schedule.disable_overlapp": True})


def test_permanent_process_changes_are_the_listed_ones():
    """Each site that changes the process for good notes it (``seams.process``): after a
    simulator run the simulator's two are in effect, and nothing unlisted can be noted."""
    import pytest

    from seams import process
    from scenarios.resolve import run_scenario
    from harness.policies import parse_policy
    run_scenario("ngram-filter-race", variant="fixed", war_barrier="fine", backend="sim",
                 policy=parse_policy("eager"), trials=1)
    assert {"sim-device", "gc-phase-callback", "torch.tensor-pinning"} <= set(process.applied())
    assert set(process.applied()) <= set(process.CHANGES)
    with pytest.raises(KeyError, match="unlisted process change"):
        process.note("torch.cuda.synchronize patched")


# A test folder named as a package would be importable under that name: pytest's default
# import mode puts the folder of a test file whose folder has no __init__.py on sys.path,
# and the folders beside that file become top-level names. ``find_spec("vllm")`` answered
# with tests/targets/vllm, so the vLLM tests ran in the core venv (no vLLM) and failed
# instead of skipping. The project's own names may stand directly under tests/ (the
# project root comes first on sys.path: pyproject's pythonpath), an upstream's nowhere.
_UPSTREAM = {"vllm", "sglang", "torch", "xgrammar", "triton", "transformers"}
_PROJECT = {"seams", "toys", "impl", "mutations", "harness", "targets", "scenarios", "litmus",
            "matrix", "specrace", "tools"}


def _shadowing_test_folders():
    tests = ROOT / "tests"
    for folder in sorted(p for p in tests.rglob("*") if p.is_dir()):
        parent = folder.parent
        on_path = (not (parent / "__init__.py").exists()
                   and any(parent.glob("test_*.py")))
        if not on_path:
            continue
        if folder.name in _UPSTREAM or (folder.name in _PROJECT and parent != tests):
            yield str(folder.relative_to(ROOT))


def test_no_test_folder_shadows_a_package():
    shadowing = list(_shadowing_test_folders())
    assert not shadowing, f"test folders importable as a package's name: {shadowing}"


@pytest.mark.parametrize("package", sorted(SUBROOMS))
def test_target_sub_rooms_import_only_downwards(graph, package):
    floors = SUBROOMS[package]
    assert _unplaced(graph, package, floors) == set()
    back = _back_edges(graph, package, floors)
    assert back - KNOWN_SUBROOM_BACK_EDGES == set(), "a new back edge between sub-rooms"


def test_the_known_sub_room_back_edges_are_still_there(graph):
    """The list may only shrink: an edge moved away is struck off it."""
    found = set().union(*(_back_edges(graph, p, f) for p, f in SUBROOMS.items()))
    assert KNOWN_SUBROOM_BACK_EDGES <= found, KNOWN_SUBROOM_BACK_EDGES - found


def test_the_floor_checks_catch_back_edges_from_the_target_and_the_run():
    fake = {"harness.target": {"harness.trials.drive"}, "harness.run": {"harness.report"},
            "harness.trials.drive": {"harness.target", "harness.run"},
            "harness.cache": {"harness.runtime"}}
    assert _back_edges(fake, "harness", LAYERS) == {
        ("harness.target", "harness.trials.drive"), ("harness.run", "harness.report")}
    assert _unplaced(fake, "harness", LAYERS) == {"harness.cache"}
    sub = {"targets.sglang.boundary.platform": {"targets.sglang.engine.loop"},
           "targets.sglang.slices.eagle": {"targets.sglang.engine.worker"}}
    assert _back_edges(sub, "targets.sglang", SUBROOMS["targets.sglang"]) == {
        ("targets.sglang.boundary.platform", "targets.sglang.engine.loop")}


def test_the_graph_sees_a_literal_importlib_back_edge(tmp_path):
    """``importlib.import_module("harness.x")`` in seams/ is a back edge the room check
    fails on; a computed name cannot be read and is no edge."""
    for name, text in {
            "seams/__init__.py": "",
            "seams/late.py": "import importlib\n\ndef f(n):\n"
                             "    importlib.import_module('harness.trials')\n"
                             "    importlib.import_module('harness.' + n)\n",
            "seams/dunder.py": "def g():\n    return __import__('specrace.cli')\n",
            "harness/__init__.py": "", "harness/trials.py": "",
            "specrace/__init__.py": "", "specrace/cli.py": "from tools.gpu import probe\n",
            "tools/gpu/probe.py": "from harness import trials\n"}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    fake = _tool().import_graph(str(tmp_path))
    assert fake["seams.late"] == {"harness.trials"}
    assert fake["seams.dunder"] == {"specrace.cli"}
    assert "harness.trials" in fake["tools.gpu.probe"]  # tools/ is in the graph
    back = {(m, d) for m, deps in fake.items() for d in deps if _room(d) > _room(m)}
    assert back == {("seams.late", "harness.trials"), ("seams.dunder", "specrace.cli"),
                    ("specrace.cli", "tools.gpu.probe")}  # nothing imports tools/
