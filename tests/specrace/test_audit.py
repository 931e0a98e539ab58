"""`specrace audit`'s parts that need no server: the racing pairs a row names, the known
races they match, the shipped configurations and their flags, the gate, the rows of a
run, the forks each configuration runs in, and bad input (one line, exit 2)."""
import os
import signal

import pytest

from harness.report import markdown, pairs, report_name
from scenarios import configurations, findings
from scenarios.registry import SCENARIOS
from seams import children
from specrace import audit, audit_fork, audit_view, cli
from targets import releases


def _acc(actor, access, file, line, fn, replayed=None):
    doc = {"actor": actor, "access": access, "op": "op", "file": file, "line": line,
           "function": fn}
    if replayed:
        doc["replayed_at"] = {"file": replayed[0], "line": replayed[1], "function": replayed[2]}
    return doc


def _race(first, second, storage="int64[8]", reuse=None):
    race = {"kind": "WAR", "storage": storage, "count": 2, "first": first, "second": second,
            "summary": "..."}
    if reuse:
        race["reuse"] = {"block": 1, "old": {"storage": "x", "stream": "main",
                                             "file": reuse[0], "line": reuse[1],
                                             "function": reuse[2]}}
    return race


READBACK = _acc("copy", "read", "sglang/srt/utils/common.py", 615, "async_d2h")


def test_the_sites_of_one_graph_replay_are_one_pair_and_another_pair_is_another_row():
    # three buffers one readback copies, each written by its own op of one replay
    replay = [_acc("forward", "write", "targets/x.py", 138 + i, "_body", ("targets/x.py", 152, "run"))
              for i in range(3)]
    other = _race(_acc("schedule", "read", "sglang/a.py", 1, "f"),
                  _acc("forward", "write", "sglang/b.py", 2, "g"))
    got = pairs.group([_race(READBACK, w, storage=f"buf{i}") for i, w in enumerate(replay)]
                      + [other])
    assert [p["sites"] for p in got] == [3, 1]
    assert got[0]["storages"] == ["buf0", "buf1", "buf2"]
    assert "targets/x.py:152 (run), a graph replay of targets/x.py:138" in got[0]["text"]
    assert "sglang/a.py:1 (f)" in got[1]["text"] and "sglang/b.py:2 (g)" in got[1]["text"]


def test_a_race_across_a_reuse_is_named_by_the_pending_access_and_the_freed_block():
    copy = _acc("draft copy", "read", "vllm/v1/worker/gpu/async_utils.py", 110, "async_copy_to_np")
    later = [_race(copy, _acc("main", "write", f"targets/k.py", n, "k"),
                   reuse=("vllm/v1/worker/gpu/sample/gumbel.py", 148, "gumbel_sample"))
             for n in (40, 41, 68)]
    (pair,) = pairs.group(later)
    assert pair["sites"] == 3
    assert "allocated at vllm/v1/worker/gpu/sample/gumbel.py:148" in pair["text"]
    assert ("vllm/v1/worker/gpu/sample/gumbel.py", "gumbel_sample") in pairs.frames(later[0])


def test_known_races_match_by_file_and_function_on_their_scenarios_and_regress_past_the_fix():
    frames = [("vllm/v1/utils.py", "copy_to_gpu"), ("vllm/v1/spec_decode/eagle.py", "propose")]
    known = findings.match("vllm", "vllm-v1-valid-count", frames, "0.17.0")
    assert known["name"] == "vllm-seq-lens" and not known["regression"]
    assert findings.match("vllm", "vllm-seq-lens-shadow", frames, "0.19.0")["regression"]
    assert findings.match("sglang", "vllm-seq-lens-shadow", frames, "0.17.0") is None
    hidden = [("sglang/srt/utils/common.py", "async_d2h"), ("impl/graph_runner.py", "replay")]
    assert findings.match("sglang", "ngram-hidden-readback", hidden)["name"] == \
        "ngram-hidden-readback"
    assert findings.match("sglang", "slot-reuse", hidden) is None  # not on its scenarios


def test_the_swa_free_before_the_barrier_is_known_on_0_5_14_and_a_regression_from_0_5_16():
    """The pair 0.5.14-0.5.15's loop ships (kv-row-reuse:swa, measured), as a report
    names it; the same pair on 0.5.16 on (upstream moved the barrier: #31687) is a
    regression, and on another scenario it is nobody's."""
    frames = [("toys/attention.py", "init_forward_metadata"), ("toys/mem_cache.py", "free")]
    known = findings.match("sglang", "kv-row-reuse", frames, "0.5.14")
    assert known["name"] == "swa-free-before-war-barrier" and not known["regression"]
    assert findings.match("sglang", "kv-row-reuse", frames, "0.5.23")["regression"]
    assert findings.match("sglang", "slot-reuse", frames, "0.5.14") is None


def test_the_plan_stream_pairs_are_known_by_their_plan_stream_end_each_to_its_fix():
    """(A), the verify's prep, was fixed in 0.5.20; (B), the draft extend's, in 0.5.22:
    a pair is told apart by its plan-stream end, upstream's function or the stand-in at
    the point upstream launches a kernel there."""
    lengths = ("sglang/srt/managers/overlap_utils.py", "resolve_seq_lens_cpu")
    verify = [lengths, ("sglang/srt/speculative/eagle_utils.py", "eagle_prepare_for_verify")]
    extend = [lengths, ("sglang/srt/speculative/eagle_worker_common.py",
                        "prepare_for_draft_extend")]
    stand_in = [("targets/sglang/slices/eagle_graphs.py", "execute"),
                ("targets/sglang/slices/eagle_kernels.py", "compute_position_triton")]
    a = findings.match("sglang", "eagle-v2", verify, "0.5.19")
    assert a["name"] == "eagle-plan-stream-verify" and not a["regression"]
    assert findings.match("sglang", "eagle-v2", verify, "0.5.20")["regression"]
    for frames in (extend, stand_in):
        b = findings.match("sglang", "eagle-v2-grammar", frames, "0.5.21")
        assert b["name"] == "eagle-plan-stream-draft-extend" and not b["regression"]
        assert findings.match("sglang", "eagle-v2", frames, "0.5.22")["regression"]
    # the lengths' writer alone names no plan stream; another scenario is not EAGLE's
    assert findings.match("sglang", "eagle-v2", [lengths], "0.5.19") is None
    assert findings.match("sglang", "ngram-filter-race", extend, "0.5.19") is None


def test_every_write_up_a_known_race_links_exists():
    for known in findings.KNOWN:
        assert os.path.isfile(os.path.join(findings_root(), known.writeup.split("#")[0])), known


def findings_root():
    from seams.paths import REPO_ROOT
    return REPO_ROOT


@pytest.mark.parametrize("target", ["sglang", "vllm"])
def test_shipped_configurations_patch_nothing_and_name_only_their_servers_flags(target):
    import targets
    other = {"sglang": ("VLLM_", "--async-scheduling", "num_speculative_tokens"),
             "vllm": ("SGLANG_", "--speculative-algorithm", "--speculative-num-draft")}[target]
    for name in targets.declared(target).scenarios:
        scenario = SCENARIOS[name]
        confs = configurations.shipped(target, scenario)
        assert confs, name
        assert len({c.variant for c in confs}) == len(confs)
        for conf in confs:
            variant = scenario.variants[conf.variant]
            assert configurations.patched_by(target, variant) == ""
            assert not any(word in flag for flag in conf.flags for word in other), conf
        patched = [v for v in scenario.variants.values()
                   if configurations.patched_by(target, v)]
        assert not {v.name for v in patched} & {c.variant for c in confs}


def test_the_audit_runs_as_installed_first_and_a_patched_variant_never():
    seed = SCENARIOS["ngram-filter-race"]
    confs = configurations.shipped("sglang", seed)
    assert [c.variant for c in confs] == ["as-installed"]  # "fixed" has the same args
    assert "pre-fix" not in [c.variant for c in confs]      # the pre-#35198 relay, patched
    assert "--speculative-algorithm NGRAM" in confs[0].flags


@pytest.mark.parametrize("row, race, new", [
    ({"verdict": "clean"}, False, False),
    ({"verdict": "race", "new": False}, True, False),
    ({"verdict": "race", "new": True}, True, True),
    ({"verdict": "crash", "new": True}, True, True),
    ({"verdict": "not applicable"}, False, False),
    ({"verdict": "error"}, True, True),  # no verdict: the audit cannot vouch for it
])
def test_the_gate(row, race, new):
    assert audit_view.meets(row, "race") is race
    assert audit_view.meets(row, "new") is new
    assert audit_view.meets(row, None) is False


def _result(races, kinds=("output", None)):
    return {"target": "vllm", "trials": len(kinds), "reproduced": sum(bool(k) for k in kinds),
            "races": races, "command": "specrace repro x",
            "trial_results": [{"divergence": k} for k in kinds],
            "first_divergence": {"kind": "output", "message": "wrong"}}


def test_two_races_on_one_configuration_are_two_rows_each_matched_or_new():
    conf = configurations.Configuration("as-installed", ("--flag",))
    seq_lens = _race(_acc("main", "read", "vllm/v1/utils.py", 132, "copy_to_gpu"),
                     _acc("host", "write", "vllm/v1/spec_decode/eagle.py", 581, "propose"))
    unknown = _race(_acc("main", "read", "vllm/v1/x.py", 1, "f"),
                    _acc("host", "write", "vllm/v1/y.py", 2, "g"))
    rows = audit.rows_of(_result([seq_lens, unknown]), "0.17.0", "vllm-v1-valid-count", conf)
    assert [r["verdict"] for r in rows] == ["race", "race"]
    assert rows[0]["known"]["name"] == "vllm-seq-lens" and not rows[0]["new"]
    assert rows[1]["known"] is None and rows[1]["new"]
    assert rows[0]["effect"] == "wrong tokens" and rows[0]["configuration"] == ["--flag"]
    clean = audit.rows_of(_result([], kinds=(None, None)), "0.17.0", "vllm-mrv2", conf)
    assert [(r["verdict"], r["effect"], r["pair"]) for r in clean] == [("clean", "", None)]


def test_an_error_row_carries_its_cause_not_a_pointer_to_the_traceback():
    from harness.target import DoesNotFit
    exc = DoesNotFit("sglang 0.5.17 does not fit the sglang target: engine crashed in the "
                     "synchronous reference run: AttributeError: 'Req' object has no "
                     "attribute 'extend_range'", problems=["run with SPECRACE_TRACEBACK=1"])
    assert "AttributeError: 'Req' object has no attribute 'extend_range'" in audit._cause(exc)
    stderr = (f"specrace: error: {exc}\n"
              "specrace:   run with SPECRACE_TRACEBACK=1 to see where it raised\n")
    assert children.child_error(stderr).endswith("'extend_range'")
    assert audit._cause(KeyError("x")) == "KeyError: 'x'"


def test_a_configurations_fork_that_dies_is_an_error_row_and_the_rest_run():
    def work(i):
        if i == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return [{"i": i, "pid": os.getpid()}]
    got = dict(audit_fork.run_forked(work, 3, 2, lambda i, how: [{"i": i, "died": how}]))
    assert got[0][0]["i"] == 0 and got[2][0]["i"] == 2
    assert got[0][0]["pid"] != os.getpid()  # each in a fork of this process
    assert got[1] == [{"i": 1, "died": "its process died of SIGKILL"}]
    assert [r["i"] for r in audit_fork.order(sorted(got.items(), reverse=True))] == [0, 1, 2]


def test_a_vllm_report_names_vllm_and_no_fence():
    info = {"target": "vllm", "vllm_version": "0.17.0", "vllm_tier": "verified",
            "vllm_files_digest": "abc123", "vllm_changed_files": []}
    line = markdown._target_line("vllm", info)
    assert "**vllm 0.17.0**" in line and "`abc123`" in line and "`vllm/...`" in line
    assert "sglang" not in line and "None" not in line
    identity = {"scenario": "s", "target": "vllm", "variant": "as-installed",
                "war_barrier": "fine", "backend": "sim", "policy": "eager", "stall_ms": None,
                "trials": 3, "seed": 0, "code": {"vllm_version": "0.17.0"}}
    assert "-fine-" not in report_name(identity)
    assert "-fine-" in report_name({**identity, "target": "sglang"})


def test_a_releases_table_names_each_racing_pair_and_the_fence_only_where_there_is_one():
    row = {"release": "0.17.0", "outcome": "race", "trials": 3, "reproduced": 3,
           "race_sites": 2, "report": "r.md", "war_barrier": "fine", "note": "",
           "pairs": [{"text": "WAR: a vs b", "sites": 1, "known": None},
                     {"text": "WAR: c vs d", "sites": 1,
                      "known": {"name": "k", "regression": False}}]}
    text = releases.format_table("vllm", "s", [row])
    assert "fence" not in text and " fine " not in text
    assert "WAR: a vs b [new]" in text and "WAR: c vs d [known: k]" in text
    assert "fence" in releases.format_table("sglang", "s", [row])


@pytest.mark.parametrize("argv, says", [
    (["audit", "--scenario", "no-such"], "unknown scenario"),
    (["audit", "--target", "vllm", "--scenario", "ngram-filter-race"], "not a scenario of"),
    (["audit", "--jsonl", "--release", "0.5.23"], "--jsonl"),
    (["audit", "--target", "impl"], "invalid choice"),
    (["audit", "--fail-on", "maybe"], "invalid choice"),
])
def test_bad_input_is_one_line_and_exit_2(argv, says, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_a_measurement_a_row_carries_gets_its_column_and_none_without_it():
    row = {"release": "0.5.23", "scenario": "slot-reuse", "variant": "as-installed",
           "configuration": ["--speculative-algorithm NGRAM"], "verdict": "clean",
           "trials": 3, "reproduced": 0, "pair": None, "effect": "", "known": None}
    plain = audit_view.table({"rows": [row], "summary": ["one line"]}, width=160)
    assert "coverage" not in plain and plain.endswith("one line")
    measured = audit_view.table({"rows": [{**row, "coverage": "12/40 sites"}],
                                 "summary": []}, width=160)
    assert "coverage" in measured and "12/40 sites" in measured
