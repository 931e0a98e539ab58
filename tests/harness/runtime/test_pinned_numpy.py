"""Numpy views of pinned memory (``runtime.pinned_numpy``) and ``torch.cuda``'s names on the
simulator (``runtime.sim.cuda_api``).

The views report every host read and write, with the bytes touched, to the run's
recorder -- and nothing for taking a view; the facade swaps the stream/event names in for
a session only and puts back exactly what it found.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.detect import detect
from harness.policies import parse_policy
from harness.runtime import hostmem
from harness.runtime.pinned_numpy import PinnedArray
from seams.context import opened


@pytest.fixture
def watched():
    """A watched pinned int32[8] buffer, its numpy view, and the accesses reported as
    (lo, hi, write) byte ranges relative to the buffer."""
    seen = []
    with opened() as ctx:
        ctx.recorder = lambda acc, write, name, frame: seen.append((acc[1], acc[2], write))
        t = hostmem.register(torch.zeros(8, dtype=torch.int32), "buf")
        view = t.numpy()
        yield t, view, seen


def test_numpy_of_a_watched_tensor_is_a_pinned_array_over_the_same_memory(watched):
    t, view, seen = watched
    assert isinstance(view, PinnedArray)
    view[3] = 7
    assert t.as_subclass(torch.Tensor)[3].item() == 7
    # an unwatched tensor's numpy() is numpy's own
    assert type(torch.zeros(2).numpy()) is np.ndarray


def test_taking_views_reports_nothing(watched):
    _, view, seen = watched
    part = view[2:6]
    part.reshape(2, 2)
    view.T  # noqa: B018
    assert seen == [] and isinstance(part, PinnedArray)


def test_iterating_rows_takes_views_and_each_row_reports_its_own_reads(watched):
    """MRv2 keeps a row view per request (``zip(req_ids, array)``): taking the rows of a
    2-D array touches no data; reading a row later is a read of that row's bytes."""
    _, view, seen = watched
    rows = list(view.reshape(4, 2))
    assert seen == [] and all(isinstance(r, PinnedArray) for r in rows)
    rows[2].tolist()
    assert seen == [(16, 24, False)]


@pytest.mark.parametrize("access, expected", [
    (lambda v: v[5], [(20, 24, False)]),
    (lambda v: v[2:4].tolist(), [(8, 16, False)]),
    (lambda v: v[1:3].sum(), [(4, 12, False)]),
    (lambda v: v[[0, 7]], [(0, 32, False)]),  # a fancy index: the whole array, conservatively
    (lambda v: list(v[6:]), [(24, 32, False)]),
    (lambda v: v[4:].copy(), [(16, 32, False)]),
    (lambda v: v[:2].astype(np.int64), [(0, 8, False)]),
    (lambda v: np.maximum(v[0:1], 3), [(0, 4, False)]),
])
def test_reads_are_reported_with_their_bytes(watched, access, expected):
    _, view, seen = watched
    access(view)
    assert seen == expected


@pytest.mark.parametrize("access, expected", [
    (lambda v: v.__setitem__(slice(0, 3), 1), [(0, 12, True)]),
    (lambda v: v[4:].fill(2), [(16, 32, True)]),
    (lambda v: np.copyto(v[1:2], 5), [(4, 8, True)]),
    (lambda v: np.add(v[:2], 1, out=v[2:4]), [(0, 8, False), (8, 16, True)]),
    (lambda v: np.cumsum(np.ones(3, np.int32), out=v[5:]), [(20, 32, True)]),
])
def test_writes_are_reported_with_their_bytes(watched, access, expected):
    _, view, seen = watched
    access(view)
    assert seen == expected


def test_an_in_place_operator_is_a_read_then_a_write(watched):
    _, view, seen = watched
    part = view[1:3]
    part += 1
    assert seen == [(4, 12, False), (4, 12, True)]
    assert isinstance(part, PinnedArray)


def test_copying_one_view_into_another_reads_the_source(watched):
    _, view, seen = watched
    view[4:6] = view[0:2]
    assert seen == [(0, 8, False), (16, 24, True)]


def test_results_are_plain_fresh_memory(watched):
    _, view, seen = watched
    assert type(view + 1) is np.ndarray
    assert type(view[[1, 2]]) is np.ndarray
    assert type(view.copy()) is np.ndarray


def test_a_view_read_before_its_copy_lands_is_a_race_on_the_simulator():
    """The detector sees a numpy-view read like a tensor read: a D2H into the buffer with
    no wait before it is a RAW race; with the copy's event synchronised, none."""
    from harness.runtime.sim.runtime import sim_runtime

    def run(wait: bool):
        with sim_runtime(parse_policy("lazy")) as rt:
            m = rt.module
            host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
            view = host.numpy()
            side = m.Stream()
            with m.stream(side):
                src = torch.arange(4, dtype=torch.int32, device=rt.device)
                host.copy_(src * 2, non_blocking=True)
                done = m.Event()
                done.record()
            if wait:
                done.synchronize()
            got = view.tolist()
            m.synchronize()
        return got, detect(rt.trace)

    got, races = run(wait=False)
    assert got == [0, 0, 0, 0] and len(races) == 1 and races[0].kind == "RAW"
    got, races = run(wait=True)
    assert got == [0, 2, 4, 6] and races == []


# --- UVA: kernels reading pinned memory in place --------------------------------------------

def test_a_uva_view_is_the_pinned_buffer_read_when_the_kernel_runs():
    """``uva_view``: the pinned buffer's own memory on the device, on its storage id. A
    kernel deferred on a stalled stream reads what the host wrote by the time it runs
    (the next step's inputs: stale), and the detector orders it against the host's write
    through the numpy view -- a WAR without the kernel's event, none with it."""
    from harness.runtime.sim.runtime import sim_runtime

    def run(fence: bool):
        with sim_runtime(parse_policy("lazy")) as rt:
            m = rt.module
            host = torch.zeros(4, dtype=torch.int32, pin_memory=True)
            host.numpy()[:] = [1, 2, 3, 4]
            uva = rt.uva_view(host)
            assert uva.device == rt.device and uva._sid == hostmem.lookup(host)[0]
            side = m.Stream()
            with m.stream(side):
                out = uva + 0  # reads the host memory when the stream runs it
                done = m.Event()
                done.record()
            if fence:
                done.synchronize()
            host.numpy()[:] = 9
            m.synchronize()
            got = out.tolist()
        return got, detect(rt.trace)

    got, races = run(fence=False)
    assert got == [9, 9, 9, 9] and [r.kind for r in races] == ["WAR"]
    got, races = run(fence=True)
    assert got == [1, 2, 3, 4] and races == []


def test_a_uva_view_of_memory_that_is_not_pinned_is_refused():
    from harness.runtime.sim.runtime import sim_runtime
    with sim_runtime() as rt, pytest.raises(ValueError, match="pinned host memory"):
        rt.uva_view(torch.zeros(4))


# --- torch.cuda's names on the simulator --------------------------------------------------

_NAMES = [(torch.cuda, "Stream"), (torch.cuda, "Event"), (torch.cuda, "stream"),
          (torch.cuda, "current_stream"), (torch.cuda, "set_stream"),
          (torch.cuda, "synchronize"), (torch, "Event"), (torch, "Stream")]


def test_a_session_answers_torch_cuda_names_and_puts_them_back():
    import harness.runtime.sim as sim
    before = [getattr(owner, name) for owner, name in _NAMES]
    with sim.session(parse_policy("eager")):
        s = torch.cuda.Stream()
        assert isinstance(s, sim.Stream) and isinstance(torch.Event(), sim.Event)
        assert isinstance(torch.cuda.Event(blocking=True), sim.Event)
        with torch.cuda.stream(s):
            assert torch.cuda.current_stream() == s
        with sim.session(parse_policy("eager")):  # nested: the inner one's device
            assert isinstance(torch.cuda.current_stream(), sim.Stream)
        assert torch.cuda.Stream is sim.module.Stream  # still swapped after the inner one
    assert [getattr(owner, name) for owner, name in _NAMES] == before


def test_names_come_back_when_the_session_raises():
    import harness.runtime.sim as sim
    before = torch.cuda.Stream
    with pytest.raises(RuntimeError, match="boom"):
        with sim.session(parse_policy("eager")):
            raise RuntimeError("boom")
    assert torch.cuda.Stream is before and torch.Event is not sim.module.Event


def test_a_module_first_imported_in_a_session_may_annotate_with_the_generic_names():
    """``torch.Stream | None`` evaluated at a module's import inside a session (vLLM
    0.34.0's eplb_utils): the session's answers are classes, so the union is a type."""
    from harness.runtime.sim.runtime import sim_runtime
    with sim_runtime():
        assert (torch.Stream | None) is not None and (torch.Event | None) is not None
        assert type(torch.Stream()).__module__.startswith("harness.runtime.sim")
