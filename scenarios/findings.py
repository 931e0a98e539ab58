"""The races already known in released servers, each with its write-up: what
``specrace audit`` (and a report) matches a racing pair against. A race no entry matches
is ``new`` -- what a server's CI gates on (``specrace audit --fail-on new``).

An entry names the pair by upstream's *files and functions*, never its lines (they move
between releases): a race matches when every (file, function) of the entry is among the
frames its accesses name (``harness.report.pairs.frames``), on one of the entry's
scenarios when it lists them. Two kinds:

* ``finding`` -- a race a release ships that can change what a user gets (or could: a
  suspicion still open), written up with its pair, configuration and a fix;
* ``settled`` -- a race a release ships that was read against what consumes the raced
  value and does not hold as a bug (the write-up says why). A scenario whose only racing
  pairs are settled ones reads ``clean`` in ``specrace releases`` (the pairs listed under
  it, ``targets.releases.settle``) -- unless a pair is the scenario's own subject
  (``subject_of``: the scenario exists to show that pair, so it stays a race there).

An entry with ``fixed_in`` is gone from that release on: the same pair on a release at or
past it is a *regression* of the known race -- and counts as new.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from packaging.version import InvalidVersion, Version

FINDING, SETTLED = "finding", "settled"


@dataclass(frozen=True)
class Known:
    name: str
    title: str
    target: str
    sites: Tuple[Tuple[str, str], ...]  # (file as reports name it, function): all present
    writeup: str  # repository-relative, with an anchor where one fits
    kind: str = FINDING
    scenarios: Tuple[str, ...] = ()  # () : any scenario
    fixed_in: Optional[str] = None  # the first release without it
    subject_of: Tuple[str, ...] = ()  # the scenarios written to show this very pair

    def matches(self, target: str, scenario: str, frames: Sequence[Tuple[str, str]]) -> bool:
        if target != self.target or (self.scenarios and scenario not in self.scenarios):
            return False
        seen = set(frames)
        return all(site in seen for site in self.sites)

    def regressed(self, version: Optional[str]) -> bool:
        """Is ``version`` at or past the release that fixed it?"""
        if self.fixed_in is None or not version:
            return False
        try:
            return Version(version) >= Version(self.fixed_in)
        except InvalidVersion:
            return False


_SG = "sglang/srt"
_VW = "vllm/v1/worker"
_VFINDINGS = "reports/upstream/vllm-releases.md"
_VALID_COUNT = ("vllm-v1-valid-count",)  # the scenario written for 0.19.0-0.27.1's sites

def _graph_readbacks(d2h: Tuple[str, str]) -> Tuple[Known, Known]:
    """The two readbacks of a graph's outputs that race the next replay, with the sglang
    D2H helper that issues them at ``d2h`` (file, function). The readback's other end is
    the toy graph runner's replay (ours): the scenario says which graph outputs it reads."""
    return (Known("dspark-result-readback", "DSpark's result readback vs the next graph replay",
                  "sglang", (d2h,), "reports/upstream/findings/graph-result-readback.md",
                  scenarios=("dspark-result-readback", "dspark-confidence-ring")),
            Known("ngram-hidden-readback",
                  "return_hidden_states readback vs the next graph replay",
                  "sglang", (d2h,), "reports/upstream/findings/ngram-hidden-readback.md",
                  scenarios=("ngram-hidden-readback",)))


_PLAN = "reports/upstream/releases.md#the-plan-streams-two-unordered-entries-2026-12-07-evening-where-they-stand"


def _plan_stream_entries() -> Tuple[Known, ...]:
    """EAGLE v2's overlap plan stream (``SGLANG_ENABLE_OVERLAP_PLAN_STREAM=1``) entered with
    no wait: (A) for the verify's prep (0.5.14 - 0.5.19), (B) for the draft extend's
    (0.5.14 - 0.5.21). A pair matches by the plan-stream end alone -- upstream's function,
    or the slice's stand-in at the point upstream calls a kernel there (``extend_cache_locs``,
    the verify graph's ``load_batch``: (A); ``compute_position_triton``: (B)) -- since its
    other end is whatever wrote the value first (the schedule stream's lengths, the draft's
    tree, a block freed by the forward)."""
    spec, stand_in = f"{_SG}/speculative", "targets/sglang/slices"
    plan = ("eagle-v2", "eagle-v2-grammar")
    verify = [(f"{spec}/eagle_utils.py", "eagle_prepare_for_verify"),
              ("sglang/kernels/ops/speculative/cache_locs.py",
               "assign_extend_cache_locs_uniform_func"),
              (f"{stand_in}/eagle_kernels.py", "extend_cache_locs"),
              (f"{stand_in}/eagle_graphs.py", "load_batch")]
    extend = [(f"{spec}/eagle_worker_common.py", "prepare_for_draft_extend"),
              (f"{spec}/base_spec_worker.py", "prepare_for_draft_extend"),  # to 0.5.15
              (f"{stand_in}/eagle_kernels.py", "compute_position_triton")]
    return (*(Known("eagle-plan-stream-verify", "(A) the verify's prep on the plan stream "
                    "before the draft and the lengths it reads", "sglang", (site,), _PLAN,
                    scenarios=plan, fixed_in="0.5.20") for site in verify),
            *(Known("eagle-plan-stream-draft-extend", "(B) the draft extend's prep on the "
                    "plan stream before the lengths it reads", "sglang", (site,), _PLAN,
                    scenarios=plan, fixed_in="0.5.22") for site in extend))


KNOWN: Tuple[Known, ...] = (
    Known("dspark-confidence-ring", "DSpark's confidence ring copy vs the next scatter",
          "sglang", ((f"{_SG}/managers/overlap_utils.py", "issue_ring_copy"),
                     (f"{_SG}/managers/overlap_utils.py", "scatter")),
          "reports/upstream/findings/confidence-ring-war.md"),
    *_graph_readbacks((f"{_SG}/utils/common.py", "async_d2h")),
    # the same two before the D2H helper moved to utils/common.py (0.5.15 - 0.5.16)
    *_graph_readbacks((f"{_SG}/managers/utils.py", "_async_d2h")),
    # upstream's loop before #31687 (0.5.14 - 0.5.15): the WAR barrier at the loop's top, so
    # result processing after a launch -- a finished request's free clearing its SWA
    # mapping -- is unordered with the launched forward's translate. The pair is in
    # specrace's SWA allocator and attention (toys/), upstream's SWATokenToKVPoolAllocator
    # and backend metadata in shape; the ordering is upstream's event_loop_overlap
    Known("swa-free-before-war-barrier", "a finished request's SWA mapping cleared in "
          "result processing vs the launched forward's translate (before #31687)", "sglang",
          (("toys/mem_cache.py", "free"), ("toys/attention.py", "init_forward_metadata")),
          "reports/upstream/releases.md#the-war-barrier-before-result-processing-0514---0515",
          scenarios=("kv-row-reuse",), fixed_in="0.5.16"),
    *_plan_stream_entries(),
    Known("vllm-seq-lens", "the drafter's in-place seq_lens increment vs its queued upload",
          "vllm", (("vllm/v1/utils.py", "copy_to_gpu"), ("vllm/v1/spec_decode/eagle.py", "propose")),
          "docs/vllm-target.md#scenarios", fixed_in="0.19.0"),
    Known("vllm-num-computed-sync", "async scheduling off: the drafter's in-place "
          "num_computed_tokens increment vs its queued upload", "vllm",
          (("vllm/v1/spec_decode/llm_base_proposer.py", "_update_positions_dependent_metadata"),),
          f"{_VFINDINGS}#what-this-means", fixed_in="0.33.0"),
    Known("vllm-mrv2-draft-tokens", "Model Runner V2's draft-token copy reads a freed "
          "temporary (no record_stream)", "vllm",
          ((f"{_VW}/gpu/async_utils.py", "async_copy_to_np"),),
          "docs/vllm-target.md#scenarios", fixed_in="0.24.0"),
    Known("vllm-v1-draft-copy", "V1's draft-token host copy vs the host's zeros and the "
          "drafts' freed block (audit S3)", "vllm",
          ((f"{_VW}/gpu_model_runner.py", "_copy_draft_token_ids_to_cpu"),),
          "reports/upstream/vllm-0.34.0-audit.md#3-suspicions-and-their-settlement"),
    Known("vllm-mrv2-uva-pool", "MRv2's drafter copy of the sampling states' UVA slot vs "
          "its restaging (audit S1)", "vllm",
          ((f"{_VW}/gpu/buffer_utils.py", ""),), kind=SETTLED,
          writeup="reports/upstream/vllm-0.34.0-audit.md#3-suspicions-and-their-settlement",
          scenarios=("vllm-mrv2-uva-pool", "vllm-mrv2", "vllm-mrv2-draft-tokens"),
          subject_of=("vllm-mrv2-uva-pool",)),
    # 0.19.0 - 0.27.1's six sites as shipped (vllm-releases.md): read against what
    # consumes each raced value; the row moves are upstream's own open reports
    Known("vllm-row-moves", "the input batch's row moves vs a queued D2H (#51599 / #53919)",
          "vllm", ((f"{_VW}/gpu_input_batch.py", "condense"),), f"{_VFINDINGS}#verdicts-as-shipped"),
    Known("vllm-row-adds", "the input batch's new rows vs a queued D2H (#51599 / #53919)",
          "vllm", ((f"{_VW}/gpu_input_batch.py", "add_request"),), f"{_VFINDINGS}#verdicts-as-shipped"),
    Known("vllm-token-count-correction", "the deferred token-count correction vs its "
          "queued upload", "vllm",
          ((f"{_VW}/gpu_model_runner.py", "correct_spec_decode_token_counts"),),
          f"{_VFINDINGS}#verdicts-as-shipped", kind=SETTLED, subject_of=_VALID_COUNT),
    Known("vllm-backup-tokens", "the drafter's backup tokens vs the previous step's upload",
          "vllm", (("vllm/v1/utils.py", "copy_to_gpu"),
                   ("vllm/v1/spec_decode/eagle.py", "prepare_next_token_ids_padded")),
          f"{_VFINDINGS}#verdicts-as-shipped", kind=SETTLED, subject_of=_VALID_COUNT),
    Known("vllm-backup-tokens-proposer", "the drafter's backup tokens vs the previous "
          "step's upload", "vllm",
          (("vllm/v1/utils.py", "copy_to_gpu"),
           ("vllm/v1/spec_decode/llm_base_proposer.py", "prepare_next_token_ids_padded")),
          f"{_VFINDINGS}#verdicts-as-shipped", kind=SETTLED, subject_of=_VALID_COUNT),
    Known("vllm-valid-count-reuse", "the valid counts' block reused before the valid-count "
          "copy reads it", "vllm",
          ((f"{_VW}/gpu_model_runner.py", "_copy_valid_sampled_token_count"),),
          f"{_VFINDINGS}#verdicts-as-shipped", kind=SETTLED, subject_of=_VALID_COUNT),
)


def match(target: str, scenario: str, frames: Sequence[Tuple[str, str]],
          version: Optional[str] = None, known: Sequence[Known] = KNOWN
          ) -> Optional[Dict[str, object]]:
    """The known race a racing pair (its ``frames``) is, as a row shows it -- name, title,
    write-up, kind, and ``regression`` when ``version`` is past its fix -- or None: new."""
    # a function of "" matches any function of that file (a site named by its file)
    wide = list(frames) + [(f, "") for f, _ in frames]
    for k in known:
        if k.matches(target, scenario, wide):
            return {"name": k.name, "title": k.title, "writeup": k.writeup, "kind": k.kind,
                    "regression": k.regressed(version), "fixed_in": k.fixed_in,
                    "subject": scenario in k.subject_of}
    return None


def entries(target: str) -> List[Known]:
    return [k for k in KNOWN if k.target == target]
