"""A release row reads what the scenario was written to show (issue 58): 0.19.0 has no
seq-lens pair, so ``specrace releases vllm-seq-lens-shadow`` reads ``clean`` there --
the three pairs it still reports are known *settled* races (read against what consumes
each value: none changes one, ``reports/upstream/vllm-releases.md``), listed under the
row, never dropped. A pair that is new, a regression, the scenario's own subject, or a
run that changed a value keeps the row a race.

In the core environment: synthetic rows through ``annotate_known`` and ``settle``, as
``specrace releases`` runs them. In 0.19.0's environment (skipped where it is not set
up): the real row, from a child ``specrace releases --json``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specrace.audit import annotate_known
from targets import releases

_VW = "vllm/v1/worker/gpu_model_runner.py"
# 0.19.0's three, as the detector's frames name them
SETTLED = [[(_VW, "correct_spec_decode_token_counts")],
           [(_VW, "_copy_valid_sampled_token_count")],
           [("vllm/v1/utils.py", "copy_to_gpu"),
            ("vllm/v1/spec_decode/eagle.py", "prepare_next_token_ids_padded")]]
SEQ_LENS = [("vllm/v1/utils.py", "copy_to_gpu"), ("vllm/v1/spec_decode/eagle.py", "propose")]


def _rows(scenario, frames, release="0.19.0", divergence=None):
    row = {"release": release, "outcome": "race", "trials": 3, "reproduced": 3,
           "race_sites": len(frames), "report": "r.md", "note": "",
           "first_divergence": divergence,
           "pairs": [{"text": f"pair {i}", "sites": 1, "frames": f}
                     for i, f in enumerate(frames)]}
    rows = [row]
    annotate_known("vllm", scenario, rows)
    releases.settle(rows)
    return rows


def test_settled_pairs_alone_read_clean_and_stay_listed():
    rows = _rows("vllm-seq-lens-shadow", SETTLED)
    row = rows[0]
    assert row["outcome"] == "clean" and row["reproduced"] == 0 and row["settled_trials"] == 3
    text = releases.format_table("vllm", "vllm-seq-lens-shadow", rows)
    for name in ("vllm-token-count-correction", "vllm-valid-count-reuse",
                 "vllm-backup-tokens"):
        assert f"[known: {name}, settled]" in text
    assert "settled pairs only, in 3/3 trials, no value changed" in text


@pytest.mark.parametrize("scenario, frames, release, divergence", [
    # a value changed: whatever the pairs, a race
    ("vllm-seq-lens-shadow", SETTLED, "0.19.0", "request 0's output diverges"),
    # the scenario's own pair beside them (here a regression past its fix, 0.19.0)
    ("vllm-seq-lens-shadow", SETTLED + [SEQ_LENS], "0.19.0", None),
    # ... and on a release that ships it
    ("vllm-seq-lens-shadow", [SEQ_LENS], "0.18.1", None),
    # a pair no entry knows
    ("vllm-seq-lens-shadow", SETTLED + [[("vllm/v1/worker/x.py", "f")]], "0.19.0", None),
    # the scenario written to show the settled pairs: they are its subject
    ("vllm-v1-valid-count", SETTLED, "0.19.0", None),
])
def test_anything_else_stays_a_race(scenario, frames, release, divergence):
    assert _rows(scenario, frames, release, divergence)[0]["outcome"] == "race"


def test_a_race_that_changed_no_value_says_so():
    """0.13.0 as shipped (async off): the seq-lens pair and no token changed -- what a
    sync-mode user has, on the row itself."""
    rows = _rows("vllm-seq-lens-shadow", [SEQ_LENS], "0.13.0")
    assert "no value changed; r.md" in releases.format_table("vllm", "x", rows)
    rows = _rows("vllm-seq-lens-shadow", [SEQ_LENS], "0.14.0", "request 0 diverges")
    assert "no value changed" not in releases.format_table("vllm", "x", rows)


def test_0_19_0_reads_clean_as_shipped():
    from targets.vllm.environments import LINE
    if "0.19.0" not in LINE.installed():
        pytest.skip("vllm 0.19.0 is not set up here (make upstream TARGET=vllm VLLM=0.19.0)")
    proc = subprocess.run([sys.executable, "-m", "specrace.cli", "releases",
                           "vllm-seq-lens-shadow", "--target", "vllm", "--release", "0.19.0",
                           "--variant", "as-installed",
                           "--trials", "1", "--json", "--expect", "clean"],
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    row, = json.loads(proc.stdout.strip().splitlines()[-1])
    assert row["outcome"] == "clean" and row["settled_trials"] == 1, row
    names = {p["known"]["name"] for p in row["pairs"]}
    assert names == {"vllm-backup-tokens", "vllm-valid-count-reuse",
                     "vllm-token-count-correction"}, row["pairs"]
