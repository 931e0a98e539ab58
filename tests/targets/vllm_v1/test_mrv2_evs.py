"""The audit's S2 (reports/upstream/vllm-0.34.0-audit.md, rows B5/B6): on a step with new
requests and EVS-pruned media, Model Runner V2 writes ``RopeState.prefill_delta``'s pinned
pool twice (``model_states/default.py:87`` via ``add_requests``, and ``:115`` after
``MultiModalPruner.recompute``), and with 2 slots the second write lands in the slot the
previous step's ``_prepare_rope_positions_kernel`` reads -- while the host has waited only
for step k-2. Driven on the simulator with upstream's own ``RopeState``, pools,
``DefaultModelState`` methods, ``MultiModalPruner`` and ``evs.recompute_mrope_positions``
(``targets/vllm/slices/evs_rope.py``; the rope kernel as a torch stand-in).

Settled here: as shipped, no race -- ``evs.recompute_mrope_positions`` reads a device
value back on the current (main) stream before it returns (``evs.py:229``, 0.27.1
``:230``), which retires step k-1's queued rope kernel before the host's second write;
with a recompute that reads nothing back, the detector names the WAR on the pool slot and
step k-1's kernel reads the new request's delta for the freed-and-reused index. Every
pruning model that gets a ``RopeState`` recomputes through that function (read from the
installed source); the one that does not use M-RoPE (Nemotron-Nano-VL) gets no pruner.
Runs in a release environment with MRv2's EVS path (0.27.1 on); skipped elsewhere.
"""
from __future__ import annotations

import ast
import importlib.util
import os

import pytest

_NEEDED = ("v1/worker/gpu/model_states/mm_pruning.py", "multimodal/video_prune/evs.py")


def _has_the_evs_path() -> bool:
    """vLLM installed, with MRv2's pruner and the evs module (found without importing)."""
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return False
    root = list(spec.submodule_search_locations)[0]
    return all(os.path.exists(os.path.join(root, *p.split("/"))) for p in _NEEDED)


pytestmark = pytest.mark.skipif(not _has_the_evs_path(), reason=(
    "vLLM with Model Runner V2's EVS pruner (model_states/mm_pruning.py, "
    "multimodal/video_prune/evs.py) is not installed in this environment"))

POLICIES = ["eager", "lazy"]
EVS_FILE = "vllm/multimodal/video_prune/evs.py"
POOL_FILE = "vllm/v1/worker/gpu/buffer_utils.py"
SLICE_FILE = "targets/vllm/slices/evs_rope.py"
# step k-1's positions: A decodes at 4, D (its index later C's) at 3, B prefills 0, 1
K1_SYNCHRONOUS = [[4, 3, 0, 1]] * 3
# ... with C's recomputed delta (-2) read for D's row instead of D's own (0)
K1_WITH_C_DELTA = [[4, 1, 0, 1]] * 3
# step k's: A at 5, B at 2, C's prompt (t, t, vision start, 4 video tokens, vision end,
# t, t) laid out by EVS: the video's first frame (t 0, h/w 0..1) from position 3, the
# text after it from 3 + llm_grid_w (2) -- delta 7 + 1 - 10 = -2
K_POSITIONS = [[5, 2, 0, 1, 2, 3, 3, 3, 3, 5, 6, 7], [5, 2, 0, 1, 2, 3, 3, 4, 4, 5, 6, 7],
               [5, 2, 0, 1, 2, 3, 4, 3, 4, 5, 6, 7]]


@pytest.fixture(scope="module")
def target():
    import targets
    return targets.get("vllm")  # the platform answers (the sim device, pinned memory)


def _run(policy: str, model_cls, wait_k2: bool = True):
    """The three steps on a fresh simulator: (the run's namespace, the trace, the races,
    the storage id of the slot step k-1 read)."""
    from harness.detect.hb import detect
    from harness.policies import parse_policy
    from harness.runtime.sim.runtime import sim_runtime
    from targets.vllm.mrv2 import seams
    from targets.vllm.slices import evs_rope as E
    with sim_runtime(parse_policy(policy)) as rt, seams.installed(), E.rope_kernel_bound():
        run = E.three_steps(rt, model_cls(rt.device), wait_k2)
        run.first_sid = rt.pinned_sid(run.pool._uva_bufs[run.first_slot].cpu)
        sid = rt.pinned_sid(run.pool._uva_bufs[run.slot].cpu)
        return run, rt.trace, detect(rt.trace), sid


def _ends(frame, path: str, function: str) -> bool:
    return bool(frame) and frame[0].endswith(path) and frame[2] == function


def _sites(trace, run, sid):
    """Step k-1's rope-kernel ops reading the slot, and the host's writes of it in step k."""
    from harness.runtime.trace import HostAccess, OpRecord
    log = trace.log
    kernel = [r for r in log[:run.k_start] if isinstance(r, OpRecord)
              and _ends(r.frame, SLICE_FILE, "prepare_rope_positions")
              and any(s == sid for s, _, _ in r.reads)]
    writes = [r for r in log[run.k_start:] if isinstance(r, HostAccess) and r.write
              and r.access[0] == sid]
    return kernel, writes


def test_the_stand_in_takes_the_rope_kernels_parameters(target):
    from targets.vllm.mrv2.table import NOT_LAUNCHED, stand_in_params
    from targets.vllm.slices import evs_rope as E
    assert E.kernel_params() == stand_in_params(E.prepare_rope_positions)
    assert (E.ROPE, E.KERNEL) in NOT_LAUNCHED  # the engine runs never launch it


@pytest.mark.parametrize("policy", POLICIES)
def test_s2_as_shipped_the_evs_read_back_orders_the_second_write(target, policy):
    """Qwen2.5-VL's recompute: the second pool write lands in step k-1's slot, but the
    first host sync of step k -- inside ``evs.recompute_mrope_positions``, on the main
    stream, past step k-1's rope kernel -- comes before it: no race, and step k-1 read
    D's own delta."""
    from harness.runtime.trace import SyncRecord
    from targets.vllm.slices import evs_rope as E
    run, trace, races, sid = _run(policy, E.QwenLikePruner)
    assert run.pool._curr == run.slot  # two writes in step k: back to step k-1's slot
    kernel, writes = _sites(trace, run, sid)
    assert kernel and len(writes) == 1
    assert _ends(writes[0].frame, POOL_FILE, "copy_to_uva")
    syncs = [r for r in trace.log[run.k_start:writes[0].index] if isinstance(r, SyncRecord)]
    assert syncs, "no host sync between step k-1's rope kernel and the second write"
    first = syncs[0]
    assert _ends(first.frame, EVS_FILE, "recompute_mrope_positions"), first
    main = kernel[-1].stream
    assert any(s == main and seq >= kernel[-1].seq for s, seq in first.waits), first.waits
    assert races == [], [r.summary() for r in races]
    assert run.outputs[1] == K1_SYNCHRONOUS and run.outputs[2] == K_POSITIONS


@pytest.mark.parametrize("policy", POLICIES)
def test_s2_a_pruner_that_reads_nothing_back_races_on_the_slot(target, policy):
    """The same step with a recompute that reads nothing back: no sync before the second
    write, and the detector names the WAR between step k-1's rope kernel (its stand-in)
    reading the pinned slot through its UVA view and ``copy_to_uva``'s host write."""
    from harness.runtime.trace import SyncRecord
    from targets.vllm.slices import evs_rope as E
    run, trace, races, sid = _run(policy, E.SyncFreePruner)
    assert run.pool._curr == run.slot
    kernel, writes = _sites(trace, run, sid)
    assert kernel and len(writes) == 1
    assert not [r for r in trace.log[run.k_start:writes[0].index]
                if isinstance(r, SyncRecord)]
    assert len(races) == 1, [r.summary() for r in races]
    race = races[0]
    assert race.kind == "WAR" and race.storage == trace.storage_name(sid)
    assert race.first.actor == "main" and not race.first.write
    assert race.first.index in {op.index for op in kernel}  # step k-1's rope kernel
    assert _ends(race.first.frame, SLICE_FILE, "prepare_rope_positions")
    assert race.second.actor == "host" and race.second.write
    assert _ends(race.second.frame, POOL_FILE, "copy_to_uva")
    assert race.second.index == writes[0].index


@pytest.mark.parametrize("policy", POLICIES)
def test_s2_values_only_the_freed_and_reused_index_differs(target, policy):
    """With the main stream stalled through step k, step k-1's queued kernel runs after
    the second write: D's decode row (D finished; C took its index) gets C's recomputed
    delta; A's and B's rows, and all of step k, are what the synchronous order gives."""
    from targets.vllm.slices import evs_rope as E
    run, _trace, _races, _sid = _run(policy, E.SyncFreePruner)
    assert int(run.slice.rope_state.prefill_delta.np[run.reused]) == -2
    assert run.outputs[1] == K1_WITH_C_DELTA and run.outputs[2] == K_POSITIONS


def test_the_first_write_is_safe_only_through_the_wait_for_step_k_minus_2(target):
    """The harness's ordering is the one the audit reads (F_{k-2}): without the host's
    wait for step k-2, step k's first pool write (``add_requests``) races with step k-2's
    rope kernel, which read that slot -- even as shipped (the EVS read-back comes later)."""
    from targets.vllm.slices import evs_rope as E
    from harness.runtime.trace import HostAccess, OpRecord
    run, trace, races, _sid = _run("eager", E.QwenLikePruner, wait_k2=False)
    log, sid = trace.log, run.first_sid
    k2_kernel = {r.index for r in log[:run.k_start] if isinstance(r, OpRecord)
                 and _ends(r.frame, SLICE_FILE, "prepare_rope_positions")
                 and any(s == sid for s, _, _ in r.reads)}
    first_write = [r.index for r in log[run.k_start:] if isinstance(r, HostAccess)
                   and r.write and r.access[0] == sid]
    assert k2_kernel and len(first_write) == 1
    assert any(r.kind == "WAR" and r.first.index in k2_kernel
               and r.second.index == first_write[0]
               and _ends(r.second.frame, POOL_FILE, "copy_to_uva") for r in races), [
        r.summary() for r in races]


# --- which models take this path: read from the installed source --------------------------

def _model_classes(root: str) -> dict:
    """name -> (bases, the module's source tree, path) for every class of the model files
    that mention pruning."""
    models = os.path.join(root, "model_executor", "models")
    out = {}
    for name in sorted(os.listdir(models)):
        path = os.path.join(models, name)
        if not name.endswith(".py") or name == "interfaces.py":
            continue
        text = open(path, encoding="utf-8").read()
        if "MultiModalPruning" not in text and "supports_multimodal_pruning" not in text:
            continue
        tree = ast.parse(text)
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                out[node.name] = (bases, node, tree, path)
    return out


def _ancestors(classes: dict, name: str) -> list:
    seen, todo = [], [name]
    while todo:
        n = todo.pop(0)
        if n in seen:
            continue
        seen.append(n)
        todo += classes[n][0] if n in classes else []
    return seen


def _flag(node: ast.ClassDef) -> bool:
    return any(isinstance(s, ast.Assign) and any(getattr(t, "id", "") ==
               "supports_multimodal_pruning" for t in s.targets) for s in node.body)


def _recomputes_through_evs(classes: dict, name: str) -> bool:
    """The class's ``recompute_mrope_positions`` (its own or inherited) calls evs's
    ``recompute_mrope_positions``, directly or through a ``_recompute_mrope_positions``
    helper of the same class, in a module importing it from the evs module."""
    for n in _ancestors(classes, name):
        if n not in classes:
            continue
        _bases, node, tree, _path = classes[n]
        methods = {m.name: m for m in node.body if isinstance(m, ast.FunctionDef)}
        if "recompute_mrope_positions" not in methods:
            continue
        imported = any(isinstance(i, ast.ImportFrom) and i.module ==
                       "vllm.multimodal.video_prune.evs" and any(
                           a.name == "recompute_mrope_positions" for a in i.names)
                       for i in tree.body)
        bodies = [methods["recompute_mrope_positions"],
                  methods.get("_recompute_mrope_positions")]
        return imported and any(
            isinstance(c, ast.Call) and getattr(c.func, "id", "") == "recompute_mrope_positions"
            for b in bodies if b is not None for c in ast.walk(b))
    return False


def test_every_pruning_model_with_mrope_recomputes_through_evs(target):
    """Each model class that prunes (``SupportsMultiModalPruning`` or the flag, inherited)
    and is ``SupportsMRoPE`` -- the only ones MRv2 builds a pruner for -- recomputes
    through ``evs.recompute_mrope_positions`` (whose read-back the run above shows)."""
    from targets import static
    classes = _model_classes(static.package_root("vllm"))
    pruning = [n for n in classes if "SupportsMultiModalPruning" in _ancestors(classes, n)
               or any(a in classes and _flag(classes[a][1]) for a in _ancestors(classes, n))]
    mrope = [n for n in pruning if "SupportsMRoPE" in _ancestors(classes, n)]
    assert "Qwen2_5_VLForConditionalGeneration" in mrope, pruning
    assert "Qwen3VLForConditionalGeneration" in mrope, pruning
    assert [n for n in mrope if not _recomputes_through_evs(classes, n)] == []
    assert "NemotronH_Nano_VL_V2" in pruning and "NemotronH_Nano_VL_V2" not in mrope


def test_a_pruning_model_without_mrope_gets_no_pruner(target):
    """MRv2 builds the pruner only beside a ``RopeState`` (``mm_pruning.py:133-140``), and
    ``get_rope_state`` builds one only for an M-RoPE model (``rope.py:131-134``: with
    ``uses_mrope`` set, a model that is not ``SupportsMRoPE`` -- Nemotron-Nano-VL --
    fails its assertion): so Nemotron-Nano-VL's EVS never reaches the second write."""
    import types
    from vllm.v1.worker.gpu.mm import rope
    from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache
    from vllm.v1.worker.gpu.model_states.mm_pruning import maybe_create_mm_pruner
    from targets.vllm.slices import evs_rope as E
    no_mrope = types.SimpleNamespace(supports_multimodal_pruning=True)
    kw = dict(model=no_mrope, max_num_reqs=2, max_num_tokens=4, max_model_len=4,
              device="cpu")
    assert E._call(rope.get_rope_state, model_config=E._config(uses_mrope=False), **kw) is None
    with pytest.raises(AssertionError):
        E._call(rope.get_rope_state, model_config=E._config(uses_mrope=True), **kw)
    assert maybe_create_mm_pruner(E._config(), no_mrope, None, EncoderCache()) is None
