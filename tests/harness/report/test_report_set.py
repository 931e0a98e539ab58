"""A report set is written as a whole (a reader sees the old set or the new one, with no
temp files left behind, SIGTERM included); every renderer survives unprintable text; the
reference cache stays bounded."""
from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import targets
from seams.paths import REPO_ROOT as ROOT
EVIL = "bad \ud800 bidi \u202e c1 \x85 esc \x1b[2J math $\\frac{$"

# A small result and trace, built the same way in this process and in the subprocesses.
SETUP = r'''
import os
from harness.detect.hb import AccessInfo, Race
from harness.trials.results import ReproResult
from harness.oracle.divergence import Divergence
from harness.runtime.trace import HOST_READ, HostAccess, OpRecord, Trace

def small_run(tag, stream_name="compute"):
    t = Trace(stream_names={0: stream_name}, storage_names={7: "pinned int32[4]"})
    frame = (os.path.join(ROOT, "impl", "worker.py"), 10, "f")
    w = OpRecord(0, "fill", [], [(7, 0, 16)], frame)
    w.seq, w.start, w.end = 1, 0.0, 1.0
    t.add(w)
    t.executed.append(w)
    h = HostAccess((7, 0, 16), False, "pinned int32[4]", frame, 0.5)
    t.add(h)
    t.log  # numbers the records
    race = Race("RAW", "pinned int32[4]", AccessInfo(stream_name, "fill", 1, True, frame, 0),
                AccessInfo("host", HOST_READ, 1, False, frame, h.index))
    result = ReproResult("x", "v", "fine", "sim", "eager", None, 0, 1, 1, "race",
                         first_trial=0, trace=t, trace_races=[race],
                         first_divergence=Divergence("crash", tag, where="trial",
                                                     observed=tag))
    return result
'''


def _small_run(tag, stream_name="compute"):
    ns = {"ROOT": ROOT}
    exec(SETUP, ns)
    return ns["small_run"](tag, stream_name)


def _name():
    from harness.report import report_name
    return report_name(_small_run("any").identity())


def _set_in(folder):
    """{file: run id carried by that file} for the set in ``folder``."""
    from harness.report.reportset import run_ids
    return run_ids(os.path.join(folder, _name()))


def _leftovers(folder):
    return sorted(e for e in os.listdir(folder) if e.startswith("."))


def test_every_file_of_a_set_carries_its_run_id(tmp_path):
    from harness.report import write_reports
    write_reports(_small_run("one"), str(tmp_path))
    ids = _set_in(tmp_path)
    assert set(ids) == {"json", "trace", "png", "md"} and len(set(ids.values())) == 1
    assert _leftovers(tmp_path) == [] and os.listdir(tmp_path) == [_name()]


def test_a_set_without_a_trace_has_no_old_trace_and_picture(tmp_path):
    from harness.report import write_reports
    write_reports(_small_run("with trace"), str(tmp_path))
    write_reports(dataclasses.replace(_small_run("no trace"), trace=None, trace_races=[]),
                  str(tmp_path))
    assert sorted(os.listdir(tmp_path / _name())) == ["report.json", "report.md"]
    assert _leftovers(tmp_path) == []


def test_a_staging_folder_left_by_a_killed_writer_is_swept(tmp_path):
    from harness.report import write_reports
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    stale = tmp_path / f".specrace-tmp-{dead}-abc"
    stale.mkdir()
    (stale / "half.json").write_text("{")
    write_reports(_small_run("one"), str(tmp_path))
    assert _leftovers(tmp_path) == []


def test_a_failing_swap_leaves_the_old_set_whole_and_no_temp_files(tmp_path, monkeypatch):
    import errno
    import pytest
    from harness.report import reportset, write_reports
    write_reports(_small_run("old"), str(tmp_path))
    old = _set_in(tmp_path)

    def broken(a, b):
        raise OSError(errno.EIO, "I/O error")
    monkeypatch.setattr(reportset, "_exchange", broken)
    with pytest.raises(OSError):
        write_reports(_small_run("new"), str(tmp_path))
    assert _set_in(tmp_path) == old and _leftovers(tmp_path) == []


def test_without_an_atomic_exchange_the_locked_fallback_swaps_the_whole_set(tmp_path,
                                                                            monkeypatch):
    import errno
    from harness.report import reportset, write_reports
    write_reports(_small_run("old"), str(tmp_path))
    old = _set_in(tmp_path)

    def unsupported(a, b):
        raise OSError(errno.EINVAL, "Invalid argument")
    monkeypatch.setattr(reportset, "_exchange", unsupported)
    write_reports(_small_run("new"), str(tmp_path))
    new = _set_in(tmp_path)
    assert len(set(new.values())) == 1 and new["json"] != old["json"]
    assert _leftovers(tmp_path) == [".specrace-lock"]


def test_concurrent_writers_of_one_name_leave_one_whole_set(tmp_path):
    import threading
    from harness.report import write_reports
    runs = [_small_run(f"writer {k}") for k in range(2)]
    for rnd in range(6):
        threads = [threading.Thread(target=write_reports, args=(r, str(tmp_path)))
                   for r in runs]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        ids = _set_in(tmp_path)
        assert len(set(ids.values())) == 1, (rnd, ids)
        assert _leftovers(tmp_path) == []


def _writer_killed(tmp_path, when: str, install: bool = False):
    """Write set 'new' over set 'old' in a subprocess that sends itself SIGTERM ``when``:
    while staging (during the picture) or right after the swap; ``install``: under the
    CLI's signal policy. Returns the old set's ids and the subprocess."""
    from harness.report import write_reports
    write_reports(_small_run("old"), str(tmp_path))
    old = _set_in(tmp_path)
    code = textwrap.dedent(f"""
        ROOT = {ROOT!r}
    """) + SETUP + textwrap.dedent(f"""
        import os, signal, sys
        from seams import signals
        import harness.report.reportset as rs
        import harness.report.timeline as tl
        from harness.report import write_reports
        when = {when!r}
        folder = {str(tmp_path)!r}
        if {install!r}:
            signals.install()
        if when == "staging":
            draw = tl.render_timeline
            def render(*a, **k):
                os.kill(os.getpid(), signal.SIGTERM)
                return draw(*a, **k)
            tl.render_timeline = render
        else:
            swap = rs.swap
            def swapped(stage, target):
                swap(stage, target)
                os.kill(os.getpid(), signal.SIGTERM)
            rs.swap = swapped
        before = set(sys.modules)
        try:
            write_reports(small_run("new"), folder)
        except signals.Interrupted as exc:
            print("interrupted", exc.status, flush=True)
            raise SystemExit(exc.status)
        print("not reached", flush=True)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert "not reached" not in proc.stdout and "Traceback" not in proc.stderr, proc.stderr
    if install:
        assert proc.returncode == 128 + signal.SIGTERM, proc.stderr
        assert "interrupted 143" in proc.stdout
    else:
        assert proc.returncode == -signal.SIGTERM, proc.stderr
    return old


def test_sigterm_while_staging_leaves_the_old_set_and_no_temp_files(tmp_path):
    old = _writer_killed(tmp_path, "staging")
    assert _set_in(tmp_path) == old
    assert _leftovers(tmp_path) == []


def test_sigterm_under_the_policy_is_honoured_after_the_write(tmp_path):
    old = _writer_killed(tmp_path, "staging", install=True)
    assert _set_in(tmp_path) == old  # staging stopped: the old set stays
    assert _leftovers(tmp_path) == []


def test_sigterm_after_the_swap_keeps_the_whole_new_set(tmp_path):
    old = _writer_killed(tmp_path, "swap")
    new = _set_in(tmp_path)
    assert len(set(new.values())) == 1 and new["json"] != old["json"]
    assert _leftovers(tmp_path) == []


def test_nothing_is_imported_inside_the_critical_section(tmp_path):
    """A signal cannot be deferred across an import that aborts the interpreter when
    interrupted (matplotlib's, once): ``preload`` imports it all before."""
    code = textwrap.dedent(f"""
        ROOT = {ROOT!r}
    """) + SETUP + textwrap.dedent(f"""
        import sys
        import harness.report.reportset as rs
        from harness.report import write_reports
        seen = []
        write_set = rs.write_set
        def watched(*a, **k):
            before = set(sys.modules)
            out = write_set(*a, **k)
            seen.extend(sorted(set(sys.modules) - before))
            return out
        rs.write_set = watched
        import harness.report as hr
        hr.write_set = watched
        write_reports(small_run("fresh"), {str(tmp_path)!r})
        print("imported:", seen)
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "imported: []" in proc.stdout, proc.stdout


# --- unprintable text -----------------------------------------------------------------

def test_printable_escapes_what_cannot_be_shown():
    from seams.text import printable
    assert printable("plain text, ümlaut, 中文") == "plain text, ümlaut, 中文"
    out = printable(EVIL)
    assert out.isprintable() and "\\ud800" in out and "\\u202e" in out and "\\x85" in out
    assert printable("a\nb", keep_newlines=True) == "a\nb" and printable("a\nb") == "a\\x0ab"
    out.encode("utf-8")


def test_every_renderer_survives_unprintable_report_fields(tmp_path):
    from harness.report import Report, write_reports
    from harness.report.markdown import render_markdown
    result = _small_run(EVIL, stream_name="fwd \ud800 \u202e")
    paths = write_reports(result, str(tmp_path))
    with open(paths["markdown"], encoding="utf-8") as f:
        md = f.read()
    assert "\\ud800" in md and "\u202e" not in md and "\x85" not in md and "\x1b" not in md
    with open(paths["trace"], encoding="utf-8") as f:
        doc = json.load(f)
    names = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert any("\\ud800" in n for n in names)
    assert all(n.isprintable() for n in names)
    with open(paths["timeline"], "rb") as f:
        assert f.read(4) == b"\x89PNG"
    md2 = render_markdown(Report(dataclasses.replace(result, scenario=EVIL)), paths, None)
    assert md2.replace("\n", "").isprintable()


# --- the reference cache is bounded --------------------------------------------------------

def test_the_reference_cache_keeps_only_the_most_recent(monkeypatch):
    from harness.trials import reference as room
    from harness.oracle.workload import RequestSpec, Workload
    from toys.server_args import ServerArgs
    monkeypatch.setattr(room, "REFERENCE_CACHE_SIZE", 2)
    monkeypatch.setattr(room, "_REFERENCE_CACHE", type(room._REFERENCE_CACHE)())
    args = ServerArgs(draft_token_num=2)
    loads = [Workload([RequestSpec(0, 0, [5 + k, 6], 1, None)], 2) for k in range(3)]
    for wl in loads:
        room.reference(wl, args, "sim", targets.get("impl"))
    room.reference(loads[1], args, "sim", targets.get("impl"))  # a hit makes it the most recent
    room.reference(loads[0], args, "sim", targets.get("impl"))  # evicts loads[2], not loads[1]
    keys = list(room._REFERENCE_CACHE)
    assert len(keys) == 2
    # key: [target, backend, workload, spec_algorithm]
    assert [json.loads(k)[2] for k in keys] == [loads[1].to_json(), loads[0].to_json()]


def test_read_set_never_mixes_two_sets_while_a_writer_swaps(tmp_path):
    """A writer swaps sets of three files in, round after round; a reader of the whole set
    (``read_set``) always gets three files of one round. (Reading the files by path one
    after another may straddle a swap: each file's run_id is how such a reader tells.)"""
    import threading
    from harness.report.reportset import read_set, write_set
    names = ("a.json", "b.json", "c.json")

    def members(round_):
        return [(n, lambda f, r=round_: f.write(str(r).encode())) for n in names]
    write_set(str(tmp_path), "set", members(0))
    stop = threading.Event()

    def writer():
        r = 1
        while not stop.is_set():
            write_set(str(tmp_path), "set", members(r))
            r += 1
    thread = threading.Thread(target=writer)
    thread.start()
    seen = set()
    try:
        for _ in range(3000):
            got = read_set(str(tmp_path / "set"), names)
            assert len(set(got.values())) == 1, got
            seen.add(got["a.json"])
    finally:
        stop.set()
        thread.join()
    assert len(seen) > 1  # the reader did read across swaps
    with pytest.raises(FileNotFoundError):
        read_set(str(tmp_path / "set"), ["missing.json"])
