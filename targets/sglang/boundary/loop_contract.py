"""The contract's reading of upstream's loop: every attribute the loop methods -- and every
Scheduler method they reach through ``self``, transitively -- read on ``self`` must be one
the target's scheduler object provides; a read by a computed name cannot be proven; a
method the loop calls on an object it holds must be a ``def`` there; and every keyword the
loop passes to the worker must be one the toy worker takes. Read statically (``static``).
"""
from __future__ import annotations

import ast
from typing import Dict, List, Tuple

from targets import static

_OU = "sglang.srt.managers.overlap_utils"
_SCHED = "sglang.srt.managers.scheduler"

# The Scheduler methods whose ``self`` reads the target must provide: upstream's loop
# and -- transitively -- every Scheduler method they call on ``self`` that the target's
# scheduler object does not provide itself (those run unmodified).
LOOP_METHODS = ("event_loop_overlap", "run_batch", "is_disable_overlap_for_batch",
                "_apply_war_barrier", "launch_batch_sample_if_needed",
                "_relay_forward_payload", "_copy_result_to_cpu", "_forward_isolation",
                "record_batch_in_overlap", "_advance_pending_grammar")
# Scheduler methods the transitive reading does not descend into: each reads what the
# target does not provide only past a guard that the target's configuration fails, or is
# called only on a branch it never takes (the branch named). A helper not named here is
# read, so a new helper's new attribute is a named problem, never a crash in the
# reference run (tests/targets/sglang_target/test_sglang_target.py runs the scenarios with each of
# these failing loudly on a read of anything the object lacks).
NOT_READ: Dict[str, str] = {
    "maybe_send_cached_prefix_chunk": "prefill disaggregation",
    "send_kv_chunk": "prefill disaggregation",
    "_send_kv_chunk": "prefill disaggregation",
    "is_fully_idle": "the idle check of a server with a waiting queue",
    "_maybe_report_active_ranks": "elastic EP's active-rank report (returns unless "
                                  "attention DP with an elastic EP backend)",
    "_pp_microbatches_drained": "pipeline parallelism",
}
# Objects upstream's loop holds on ``self`` whose methods it calls (``self.NAME.m(...)``):
# each method called must be a ``def`` of the class (not reassigned to a value).
SELF_OBJECTS: Dict[str, str] = {"future_map": f"{_OU}:FutureMap"}


def loop_problems(root: str, provided: Tuple[str, ...], worker_keywords: Tuple[str, ...]
                  ) -> List[str]:
    """What upstream's loop methods -- and every Scheduler method they reach through
    ``self`` -- read on ``self`` that the scheduler object lacks, read by a computed
    name, or call on an object that is not a function there."""
    problems: List[str] = []
    bodies = scheduler_bodies(root)
    have = set(provided) | set(bodies) | scheduler_methods(root)
    reached, todo = [], [m for m in LOOP_METHODS if m in bodies]
    while todo:  # an older release without a helper: the loop does not call it
        name = todo.pop(0)
        if name in reached:
            continue
        reached.append(name)
        node = bodies[name]
        for attr, kind in sorted(static.self_reads(node).items()):
            if attr in bodies and attr not in provided:
                if attr not in NOT_READ:
                    todo.append(attr)
            elif attr not in have:
                problems.append(f"Scheduler.{name} reads self.{attr}, which the target's "
                                f"scheduler does not provide")
        problems += [f"Scheduler.{name} reads an attribute of self by a computed name "
                     f"(line {line}): the target cannot prove it provides it"
                     for line in static.computed_self_reads(node)]
        for attr, cls in SELF_OBJECTS.items():
            problems += [p for m in sorted(static.calls_on(node, attr))
                         if (p := static.is_function(root, f"{cls}.{m}"))]
    loop, _ = static.find(root, f"{_SCHED}:Scheduler.run_batch")
    if loop is not None:
        extra = static.call_keywords(loop, "self.model_worker",
                                    "forward_batch_generation") - set(worker_keywords)
        extra -= {"pp_proxy_tensors"}  # the pipeline-parallel branch, not taken
        problems += [f"run_batch passes {kw}= to the worker, which the toy worker does "
                     f"not take" for kw in sorted(extra)]
    return problems


def _scheduler_classes(root: str) -> List[ast.ClassDef]:
    """``Scheduler`` and its base classes (each found in the module the scheduler's
    module imports it from), the class itself first."""
    node, _ = static.find(root, f"{_SCHED}:Scheduler")
    if not isinstance(node, ast.ClassDef):
        return []
    classes = [node]
    where = static.imported_names(root, _SCHED)
    for base in node.bases:
        name = getattr(base, "id", None)
        if name in where:
            cls, _ = static.find(root, f"{where[name]}:{name}")
            if isinstance(cls, ast.ClassDef):
                classes.append(cls)
    return classes


def scheduler_bodies(root: str) -> Dict[str, ast.AST]:
    """The ``def`` nodes of ``Scheduler`` and of its base classes, by name (the class's
    own over a base's, the last binding in a body over an earlier one)."""
    out: Dict[str, ast.AST] = {}
    for cls in reversed(_scheduler_classes(root)):
        for s in cls.body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out[s.name] = s
            elif isinstance(s, ast.Assign):
                for t in s.targets:  # a name rebound to a value is no longer a method
                    if isinstance(t, ast.Name):
                        out.pop(t.id, None)
    return out


def scheduler_methods(root: str) -> set:
    """Every name bound in the bodies of ``Scheduler`` and of its base classes."""
    out = set()
    for cls in _scheduler_classes(root):
        for s in cls.body:
            if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(s.name)
            elif isinstance(s, ast.Assign):
                out |= {t.id for t in s.targets if isinstance(t, ast.Name)}
            elif isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name):
                out.add(s.target.id)
    return out
