"""The census scanner (``targets.census``): every kind on small synthetic sources, files
it cannot read, deterministic order, the context each site carries; and the census of
the installed sglang finding sites known to be there."""
from __future__ import annotations

import os
import textwrap

import pytest

from targets.census import KINDS, census, scan_source, scan_tree
from targets.census_rules import KINDS as RULE_KINDS

EVERY_KIND = textwrap.dedent('''
    import torch
    from threading import Event as HostEvent

    class Worker:
        def __init__(self):
            self.forward_stream = torch.cuda.Stream()
            self.copy_done = torch.cuda.Event()
            self.host_buf = torch.empty(8, pin_memory=True)
            self.pool = torch.cuda.graph_pool_handle()

        def step(self, x, other):
            with torch.cuda.stream(self.forward_stream):
                cur = torch.cuda.current_stream()
                cur.wait_stream(self.forward_stream)
                cur.wait_event(self.copy_done)
                self.copy_done.record()
                if self.copy_done.query():
                    self.copy_done.synchronize()
                x.record_stream(cur)
                y = x.to("cuda", non_blocking=True)
                other.copy_(y, non_blocking=True)
                staged = y.pin_memory()
                self.host_buf[:2] = 1
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=self.pool):
                    pass
                g.replay()
                torch.cuda.synchronize()
                return y.item(), staged
''')


def _kinds(sites):
    return {s.kind for s in sites}


def test_every_kind_is_found_and_nothing_else():
    sites, problem = scan_source(EVERY_KIND, "srt/w.py")
    assert problem == ""
    expected = set(KINDS) - {"sync-readback"}
    assert _kinds(sites) == expected
    with_readbacks, _ = scan_source(EVERY_KIND, "srt/w.py", readbacks=True)
    assert _kinds(with_readbacks) == set(KINDS)
    assert KINDS == RULE_KINDS


def test_each_site_carries_file_line_function_and_its_statement():
    sites, _ = scan_source(EVERY_KIND, "srt/w.py")
    lines = EVERY_KIND.splitlines()
    for s in sites:
        assert s.file == "srt/w.py"
        assert s.function in ("Worker.__init__", "Worker.step")
        assert s.span[0] <= s.line <= s.span[1]
        assert s.text  # the call as written, for a reader
    wait = next(s for s in sites if s.kind == "wait-stream")
    assert "wait_stream" in lines[wait.line - 1] and wait.function == "Worker.step"
    # a site in a with-header spans the header alone, not the block under it
    switch = next(s for s in sites if s.kind == "stream-switch")
    assert switch.span == (switch.line, switch.line)


def test_guards_record_the_enclosing_if_tests_with_their_polarity():
    src = textwrap.dedent('''
        import torch
        def f(x):
            if _is_hip:
                x.record_stream(torch.cuda.current_stream())
            else:
                torch.cuda.synchronize()
    ''')
    sites, _ = scan_source(src)
    by_kind = {s.kind: s for s in sites}
    assert by_kind["record-stream"].guards == ("_is_hip",)
    assert by_kind["device-sync"].guards == ("not (_is_hip)",)


def test_host_events_and_plain_objects_are_not_sites():
    src = textwrap.dedent('''
        import threading, torch
        class Loop:
            def __init__(self):
                self.stop_event = threading.Event()
                self.corpus = make_corpus()
            def run(self, metrics):
                self.stop_event.wait()
                metrics.record(3, 4)
                self.corpus.synchronize()
                x = torch.empty(3, pin_memory=False)
                return x.to("cuda", non_blocking=False)
    ''')
    sites, problem = scan_source(src)
    assert problem == "" and sites == []


def test_pinned_host_writes_through_views_and_factories():
    src = textwrap.dedent('''
        class Runner:
            def __init__(self):
                self.ids = CpuGpuBuffer(8)
                self.plain = make(8)
            def prepare(self, n):
                self.ids.np[:n] = 3
                self.plain[:n] = 3
    ''')
    sites, _ = scan_source(src, factories=("CpuGpuBuffer",))
    writes = [s for s in sites if s.kind == "pinned-host-write"]
    assert [(w.function, "ids" in w.text) for w in writes] == [("Runner.prepare", True)]
    assert {s.kind for s in sites} == {"pinned-alloc", "pinned-host-write"}


def test_a_file_that_does_not_parse_is_listed_not_raised(tmp_path):
    area = tmp_path / "srt" / "managers"
    area.mkdir(parents=True)
    (area / "good.py").write_text("import torch\ndef f(s):\n    s.wait_stream(s)\n")
    (area / "broken.py").write_text("def f(:\n    torch.cuda.synchronize()\n")
    # a left-leaning chain of 2,000 additions: the parser takes it, the walk refuses it
    deep = "import torch\ntorch.cuda.synchronize()\nx = " + "+".join(["1"] * 2000) + "\n"
    (area / "deep.py").write_text(deep)
    (area / "quiet.py").write_text("def f(:\n")  # no site can be in it: never parsed
    sites, unreadable, files, missing = scan_tree(str(tmp_path), ("srt/managers", "srt/gone"))
    assert [(s.file, s.kind) for s in sites] == [("srt/managers/good.py", "wait-stream")]
    why = dict(unreadable)
    assert set(why) == {"srt/managers/broken.py", "srt/managers/deep.py"}
    assert why["srt/managers/broken.py"].startswith("does not parse")
    assert why["srt/managers/deep.py"].startswith("nested deeper")
    assert files == 4 and missing == ("srt/gone",)


def test_order_is_deterministic(tmp_path):
    area = tmp_path / "pkg"
    area.mkdir()
    for name in ("b.py", "a.py", "c.py"):
        (area / name).write_text(EVERY_KIND)
    first = scan_tree(str(tmp_path), ("pkg",))
    second = scan_tree(str(tmp_path), ("pkg",))
    assert first == second
    keys = [s.key for s in first[0]]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def _sglang_root():
    """The sglang 0.5.23 package to read: installed here, or its release environment."""
    from targets import static
    from importlib import metadata
    try:
        if metadata.version("sglang") == "0.5.23":
            return static.package_root("sglang"), None
    except metadata.PackageNotFoundError:
        pass
    from targets.sglang.environments import LINE
    if "0.5.23" in LINE.installed():
        return LINE.release_root("0.5.23"), "0.5.23"
    pytest.skip("sglang 0.5.23 is neither installed here nor set up "
                "(make upstream / make upstream SGLANG=0.5.23)")


def test_the_sglang_census_finds_the_schedulers_known_sites():
    root, _ = _sglang_root()
    sites, unreadable, files, missing = scan_tree(root, ("srt/managers",))
    assert files > 0 and not missing
    found = {(s.file, s.function, s.kind) for s in sites}
    # the WAR fence and the result copy (scheduler.py), the relay's publish (overlap_utils)
    assert ("srt/managers/scheduler.py", "Scheduler._apply_war_barrier", "wait-stream") in found
    assert ("srt/managers/scheduler.py", "Scheduler._copy_result_to_cpu", "wait-stream") in found
    assert ("srt/managers/overlap_utils.py", "FutureMap.publish", "event-record") in found


def test_census_rejects_what_it_cannot_read():
    from targets.census import CensusError
    with pytest.raises(CensusError, match="unknown target"):
        census("impl")
    with pytest.raises(CensusError, match="not a version"):
        census("sglang", "x;y")
    assert os.path.sep  # (keeps the import used on every platform)


def test_the_vllm_census_finds_both_runners_sites():
    from targets.vllm.environments import LINE
    if "0.17.0" not in LINE.installed():
        pytest.skip("vLLM 0.17.0 is not set up (make upstream TARGET=vllm VLLM=0.17.0)")
    c = census("vllm", "0.17.0")
    assert c.version == "0.17.0" and not c.unreadable
    found = {(s.file, s.function, s.kind) for s in c.sites}
    # V1's valid-count event (the seq-lens window) and Model Runner V2's async output
    assert ("v1/worker/gpu_model_runner.py", "GPUModelRunner._copy_valid_sampled_token_count",
            "event-record") in found
    assert ("v1/worker/gpu/async_utils.py", "AsyncOutput.__init__", "event-record") in found
    # host writes through CpuGpuBuffer's numpy view (a pinned-buffer factory)
    assert any(f == "v1/worker/gpu_model_runner.py" and k == "pinned-host-write"
               and fn == "GPUModelRunner._prepare_inputs" for f, fn, k in found)
