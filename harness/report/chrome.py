"""The trace in Chrome trace-event format (ui.perfetto.dev, chrome://tracing).

Process "specrace" (pid 1); tid 0 is the host, tid ``sid + 1`` is stream ``sid``.
Ops are complete slices (``X``); host syncs, queries and pinned-memory accesses are
instants (``i``) on the host lane; event record -> wait edges are flow arrows (``s``/``f``);
both accesses of each race carry ``args.race`` and ``cname`` "terrible", with a flow
arrow named "race" from the first access to the second.
"""
from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from harness.runtime.trace import (HostAccess, OpKind, OpRecord, QueryRecord, SyncRecord, Trace,
                                   access_label)

from harness.report.common import (HostRecord, Layout, access_names, host_label, host_records,
                                   layout, op_at, race_marks, stream_ids, time_note, where)
from seams.text import printable_tree

if TYPE_CHECKING:
    from harness.detect import Race
    from harness.report.document import Report
    from harness.trials.results import ReproResult

PID = 1
HOST_TID = 0
RACE_CNAME = "terrible"


def tid_of(sid: int) -> int:
    return sid + 1


def _inside(ts: float, dur: float) -> float:
    """A time strictly inside a slice, for binding flow events to it."""
    return ts + dur / 2.0 if dur > 0 else ts


def chrome_trace(trace: Trace, races: List[Race], report: Optional[Report] = None
                 ) -> Dict[str, Any]:
    """The Chrome trace of ``trace``; ``report`` (a ``document.Report``) labels it (None:
    unlabelled, as ``trace_digest`` hashes it)."""
    result = report.result if report is not None else None
    lay = layout(trace)
    marks = race_marks(trace, races)
    note = time_note(lay)
    events = _metadata_events(trace, lay, note, result)

    slot: Dict[int, Dict[str, Any]] = {}  # log index -> event (ops and host instants)
    for op in lay.ops:
        ev = _op_event(trace, lay, op, marks)
        events.append(ev)
        slot[op.index] = ev
    for rec in host_records(trace):
        ev = _host_event(trace, lay, rec, marks)
        events.append(ev)
        slot[rec.index] = ev

    # --- flows: event record -> wait, and race pairs ---
    links = _wait_links(trace, lay, slot) + _race_links(races, slot)
    for fid, (src, dst, name, cat, args) in enumerate(links, 1):
        events.extend(_flow(fid, src, dst, name, cat, args))

    other = _other_data(result, report, lay, note, races)
    return printable_tree({"traceEvents": events, "displayTimeUnit": "ms", "otherData": other})


def _metadata_events(trace: Trace, lay: Layout, note: str, result: Optional[ReproResult]
                     ) -> List[Dict[str, Any]]:
    """The process (named, labelled with the run) and its lanes: the host, then a lane per
    stream, in stream order."""
    events: List[Dict[str, Any]] = []
    events.append({"ph": "M", "pid": PID, "tid": HOST_TID, "name": "process_name",
                   "args": {"name": "specrace", "time_base": lay.mode, "time_note": note}})
    # (the unlabelled form feeds ``trace_digest``: recorded digests depend on it)
    label = ("? [?, ? fence] ?" if result is None else
             f"{result.scenario} [{result.variant}, {result.war_barrier} fence] {result.backend}")
    events.append({"ph": "M", "pid": PID, "tid": HOST_TID, "name": "process_labels",
                   "args": {"labels": label}})
    events.append({"ph": "M", "pid": PID, "tid": HOST_TID, "name": "thread_name",
                   "args": {"name": "host"}})
    events.append({"ph": "M", "pid": PID, "tid": HOST_TID, "name": "thread_sort_index",
                   "args": {"sort_index": 0}})
    for sid in stream_ids(trace):
        events.append({"ph": "M", "pid": PID, "tid": tid_of(sid), "name": "thread_name",
                       "args": {"name": f"{trace.stream_name(sid)} (stream {sid})"}})
        events.append({"ph": "M", "pid": PID, "tid": tid_of(sid), "name": "thread_sort_index",
                       "args": {"sort_index": tid_of(sid)}})
    return events


def _op_event(trace: Trace, lay: Layout, op: OpRecord, marks: Dict[int, List[str]]
              ) -> Dict[str, Any]:
    """An op as a complete slice (``X``) on its stream's lane."""
    ts, end = lay.span[op.index]
    args: Dict[str, Any] = {
        "stream": trace.stream_name(op.stream), "seq": op.seq, "kind": op.kind,
        "reads": access_names(trace, op.reads),
        "writes": access_names(trace, op.writes),
        "where": where(op.frame), "trace_index": op.index,
    }
    if op.replay is not None:  # issued by a CUDA graph replay; "where" is the capture
        args["graph_replay"] = (f"graph {op.replay.graph} replay {op.replay.n} at "
                                f"{where(op.replay.frame)}")
    if op.wait_for is not None:
        args["wait_for"] = f"{trace.stream_name(op.wait_for[0])}#{op.wait_for[1]}"
    if lay.mode == "virtual":
        args["enqueued_at_us"] = op.enq
        if op.kind == OpKind.STALL:
            args["held_from_us"], args["released_at_us"] = ts, op.start
    ev = {"ph": "X", "pid": PID, "tid": tid_of(op.stream), "name": op.name,
          "cat": op.kind, "ts": ts, "dur": max(0.0, end - ts), "args": args}
    _mark_race(ev, op.index, marks)
    return ev


def _host_event(trace: Trace, lay: Layout, rec: HostRecord, marks: Dict[int, List[str]]
                ) -> Dict[str, Any]:
    """A host sync, query or pinned-memory access as an instant (``i``) on the host lane."""
    args = {"where": where(rec.frame), "trace_index": rec.index}
    if isinstance(rec, SyncRecord):
        args["waits"] = [f"{trace.stream_name(s)}#{n}" for s, n in rec.waits]
        cat = "sync"
    elif isinstance(rec, QueryRecord):
        args["position"] = f"{trace.stream_name(rec.position[0])}#{rec.position[1]}"
        cat = "query"
    else:
        assert isinstance(rec, HostAccess)
        sid, lo, hi = rec.access
        args["access"] = access_label(rec.write)
        args["storage"] = f"{rec.name} [{lo}:{hi})"
        cat = "host_access"
    ev = {"ph": "i", "s": "t", "pid": PID, "tid": HOST_TID, "name": host_label(rec, trace),
          "cat": cat, "ts": lay.host_time(rec), "args": args}
    _mark_race(ev, rec.index, marks)
    return ev


def _mark_race(ev: Dict[str, Any], index: int, marks: Dict[int, List[str]]) -> None:
    """A racing access's event names its races in ``args.race`` and is drawn in red."""
    if index in marks:
        ev["args"]["race"] = ", ".join(marks[index])
        ev["cname"] = RACE_CNAME


def _wait_links(trace: Trace, lay: Layout, slot: Dict[int, Dict[str, Any]]) -> List[tuple]:
    """(src, dst, name, cat, args) of a flow from each event record to its wait."""
    links: List[tuple] = []
    by_pos = op_at(trace)
    for op in lay.ops:
        if op.kind != OpKind.WAIT or op.wait_for is None or op.wait_for[1] <= 0:
            continue
        rec_op = by_pos.get(tuple(op.wait_for))
        if rec_op is None or rec_op.index not in slot or op.index not in slot:
            continue
        links.append((slot[rec_op.index], slot[op.index], "event", "sync", None))
    return links


def _race_links(races: List[Race], slot: Dict[int, Dict[str, Any]]) -> List[tuple]:
    """(src, dst, name, cat, args) of a flow from each race's first access to its second."""
    links: List[tuple] = []
    for n, race in enumerate(races, 1):
        a, b = slot.get(race.first.index), slot.get(race.second.index)
        if a is None or b is None:
            continue
        links.append((a, b, "race", "race", {"race": f"{race.kind} #{n}",
                                             "storage": race.storage}))
    return links


def _flow(fid: int, src: Dict[str, Any], dst: Dict[str, Any], name: str, cat: str,
          args: Optional[dict] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """The flow ``fid`` from ``src`` to ``dst``: its start (``s``) and end (``f``) events."""
    ts_src = _inside(src["ts"], src.get("dur", 0.0)) if src["ph"] == "X" else src["ts"]
    ts_dst = _inside(dst["ts"], dst.get("dur", 0.0)) if dst["ph"] == "X" else dst["ts"]
    args = dict(args or {})
    if ts_dst < ts_src:
        # Viewers bind a flow's "f" only after its "s" in time: a race whose second
        # access (host order) ran first is drawn from the earlier slice to the later.
        src, dst, ts_src, ts_dst = dst, src, ts_dst, ts_src
        args["drawn"] = "from the access that ran first (the second in host order)"
    s = {"ph": "s", "pid": PID, "tid": src["tid"], "name": name, "cat": cat, "id": fid,
         "ts": ts_src}
    f = {"ph": "f", "bp": "e", "pid": PID, "tid": dst["tid"], "name": name, "cat": cat,
         "id": fid, "ts": ts_dst}
    if args:
        s["args"] = args
    return s, f


def _other_data(result: Optional[ReproResult], report: Optional[Report], lay: Layout, note: str,
                races: List[Race]) -> Dict[str, Any]:
    """The trace's ``otherData``: the run's settings and races, the time base, the run id."""
    run = ({k: getattr(result, k) for k in ("scenario", "variant", "war_barrier", "backend",
                                            "policy", "seed")} if result is not None else {})
    return {**run, "trial": (result.first_trial or 0) if result is not None else 0,
            "time_base": lay.mode, "time_note": note,
            "ops_not_executed": lay.not_executed,
            "races": [f"{r.kind} #{n}: {r.summary()}" for n, r in enumerate(races, 1)],
            "run_id": report.run_id if report is not None else None}


def trace_digest(trace: Trace, races: List[Race]) -> str:
    """sha256 of the trace's events as the Chrome trace shows them (without the run's
    labels): a replay that shows the same trace has the same digest."""
    events = chrome_trace(trace, races, None)["traceEvents"]
    text = json.dumps(events, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
