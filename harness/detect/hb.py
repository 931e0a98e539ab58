"""Happens-before race detection over a trace, with vector clocks (the CSAN model, extended).

Actors are the streams and the host. The log is in host program order, and every op is
enqueued by the host, so clocks are computed from the *program's* synchronisation alone --
never from the schedule that happened to run. A race hidden by a lucky schedule is still
reported. Edges:

* program order within a stream and within the host;
* host -> op at enqueue (the op cannot start before the host launched it);
* event record -> wait_event (a wait marker joins the clock of the recorded position);
* position -> host at ``synchronize()`` / blocking copies / implicit syncs, and at a
  ``query()`` that returned True (CSAN has no callback for it and reports polling loops
  as races; we do not);
* host accesses of pinned memory are accesses like any other (CSAN ignores CPU tensors,
  so it cannot see a host reading a buffer a non_blocking D2H copy is still filling);
* caching-allocator reuse: when a block goes to a new storage (``AllocRecord.prev``), the
  previous owner's accesses that are still unordered move over to the new storage, so an
  old owner's kernel that may still run is checked against the new owner's accesses.
  ``record_stream`` is honoured the way the allocator honours it: the free's ``waits``
  (the recorded streams' positions at the free) have executed before the block is handed
  out, so old accesses ordered before them are dropped at the reuse. Nothing else is
  joined -- the allocator's event query is not a synchronisation the program asked for.
* a CUDA graph replay is the captured ops, issued on the replaying stream (``ReplayedOp``):
  their accesses are checked like any op's and reported with both the capture site and
  the replay site (CSAN sees nothing of a replay).

Shadow state per storage keeps the accesses not yet superseded (FastTrack-style pruning),
with byte ranges, so distinct rows of one buffer do not conflict, but overlapping views do.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Set

from harness.runtime.trace import (HOST, HOST_READ, HOST_WRITE, AllocRecord, Frame, FreeRecord,
                             HostAccess, OpKind, OpRecord, Position, QueryRecord, SyncRecord,
                             Trace, access_label, frame_text, short_path)

VC = Dict[int, int]
_WAIT = OpKind.WAIT  # a module global: looked up per op (an enum attribute costs more)


@dataclass(frozen=True)
class AccessInfo:
    actor: str  # stream name or "host"
    op: str
    seq: int
    write: bool
    frame: Optional[Frame]  # for an op replayed from a CUDA graph: where it was captured
    index: int  # position in the trace log
    # Where the graph was replayed: a field of ``ReplayedAccess`` only, so the accesses of
    # ordinary ops (one AccessInfo each, the detector's hot path) cost no more.
    replayed_at = None

    def access_kind(self) -> str:
        return access_label(self.write)

    def where(self) -> str:
        return frame_text(self.frame)

    def site(self) -> str:
        """``at FILE:LINE (fn)``, or for a replayed op both sites."""
        if self.replayed_at is None:
            return f"at {self.where()}"
        return f"captured at {self.where()}, replayed at {frame_text(self.replayed_at)}"

    def to_json(self) -> dict:
        out = {"actor": self.actor, "op": self.op, "seq": self.seq,
               "access": access_label(self.write),
               "file": short_path(self.frame[0]) if self.frame else None,
               "line": self.frame[1] if self.frame else None,
               "function": self.frame[2] if self.frame else None,
               "trace_index": self.index}
        if self.replayed_at is not None:
            f = self.replayed_at
            out["replayed_at"] = {"file": short_path(f[0]), "line": f[1], "function": f[2]}
        return out

    @staticmethod
    def from_json(doc: dict) -> "AccessInfo":
        """An access as a validated report recorded it (its file project-relative, as
        ``to_json`` wrote it: ``short_path`` leaves it so)."""
        fields = (doc.get("actor", "?"), doc.get("op", "?"), doc.get("seq", 0),
                  doc.get("access") == "write", _frame(doc), doc.get("trace_index", -1))
        replay = doc.get("replayed_at")
        return AccessInfo(*fields) if replay is None else ReplayedAccess(*fields, _frame(replay))


@dataclass(frozen=True)
class ReplayedAccess(AccessInfo):
    """An access of an op issued by a CUDA graph replay."""
    replayed_at: Optional[Frame] = None


@dataclass(frozen=True)
class Owner:
    """One storage that held a block: what it was, where and on which stream allocated."""
    storage: str
    stream: Optional[str]  # the home stream (None: allocated before the trace began)
    frame: Optional[Frame]

    def where(self) -> str:
        return frame_text(self.frame, function=False)

    def describe(self) -> str:
        on = f" on {self.stream}" if self.stream else ""
        at = f" at {self.where()}" if self.frame and self.where() not in self.storage else ""
        return f"{self.storage} (allocated{on}{at})" if on or at else self.storage

    def to_json(self) -> dict:
        return {"storage": self.storage, "stream": self.stream,
                "file": short_path(self.frame[0]) if self.frame else None,
                "line": self.frame[1] if self.frame else None,
                "function": self.frame[2] if self.frame else None}

    @staticmethod
    def from_json(doc: dict) -> "Owner":
        return Owner(doc.get("storage", "?"), doc.get("stream"), _frame(doc))


@dataclass(frozen=True)
class Reuse:
    """The block a race went through: freed by ``old``, handed by the allocator to ``new``."""
    block: int
    old: Owner
    new: Owner

    def to_json(self) -> dict:
        return {"block": self.block, "old": self.old.to_json(), "new": self.new.to_json()}

    @staticmethod
    def from_json(doc: dict) -> "Reuse":
        return Reuse(doc.get("block", -1), Owner.from_json(doc.get("old") or {}),
                     Owner.from_json(doc.get("new") or {}))


@dataclass
class Race:
    kind: str  # RAW | WAR | WAW (first access, then second, in host enqueue order)
    storage: str
    first: AccessInfo
    second: AccessInfo
    count: int = 1
    reuse: Optional[Reuse] = None  # set when the two accesses went through different owners

    def key(self) -> tuple:
        return (self.kind, self.first.actor, self.first.op, self.first.frame,
                self.first.replayed_at, self.second.actor, self.second.op, self.second.frame,
                self.second.replayed_at, self.reuse is not None)

    def summary(self) -> str:
        if self.reuse is None:
            head = f"{self.kind} on {self.storage}"
        else:
            r = self.reuse
            head = (f"{self.kind} across a reuse of block {r.block}: freed by "
                    f"{r.old.describe()}, reallocated to {r.new.describe()}")
        return (f"{head}: {self.first.actor} {self.first.op} "
                f"[{self.first.access_kind()}] {self.first.site()} is "
                f"unordered with {self.second.actor} {self.second.op} "
                f"[{self.second.access_kind()}] {self.second.site()}"
                + (f" (x{self.count})" if self.count > 1 else ""))

    def to_json(self) -> dict:
        out = {"kind": self.kind, "storage": self.storage, "count": self.count,
               "first": self.first.to_json(), "second": self.second.to_json(),
               "summary": self.summary()}
        if self.reuse is not None:
            out["reuse"] = self.reuse.to_json()
        return out

    @staticmethod
    def from_json(doc: dict) -> "Race":
        """A race as a report validated by ``harness.report.schema`` recorded it (its
        ``summary`` is not read: it is this class's to write)."""
        reuse = doc.get("reuse")
        return Race(doc["kind"], doc.get("storage", "?"), AccessInfo.from_json(doc["first"]),
                    AccessInfo.from_json(doc["second"]), doc.get("count", 1),
                    None if reuse is None else Reuse.from_json(reuse))


def _frame(doc: dict) -> Optional[Frame]:
    """A site's ``(file, line, function)`` from its JSON (None: no file recorded)."""
    return None if doc.get("file") is None else (doc["file"], doc.get("line"),
                                                 doc.get("function"))


class _Entry:
    """One access in the shadow state. Its ``AccessInfo`` is built only when it is part
    of a race (``info()``): an access per op is the detector's hot path."""

    __slots__ = ("actor", "n", "lo", "hi", "write", "rec", "name", "owner")

    def __init__(self, actor: int, n: int, lo: int, hi: int, write: bool, rec, name: str,
                 owner: Optional[int] = None) -> None:
        self.actor, self.n, self.lo, self.hi, self.write = actor, n, lo, hi, write
        self.rec = rec  # the OpRecord or HostAccess that made it
        self.name = name  # the actor's name when it was made
        self.owner = owner  # sid of an earlier owner of the block (None: this storage)

    def info(self) -> AccessInfo:
        rec = self.rec
        if isinstance(rec, HostAccess):
            return AccessInfo("host", HOST_WRITE if self.write else HOST_READ, self.n,
                              self.write, rec.frame, rec.index)
        if rec.replay is not None:
            return ReplayedAccess(self.name, rec.name, rec.seq, self.write, rec.frame,
                                  rec.index, rec.replay.frame)
        return AccessInfo(self.name, rec.name, rec.seq, self.write, rec.frame, rec.index)


def _join(into: VC, other: VC) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class HBDetector:
    """Incremental: ``update()`` consumes the trace records added since the last call, so
    a state machine can check after every step without re-reading the whole trace."""

    def __init__(self, trace: Trace, positions: Optional[Set[Position]] = None) -> None:
        self.trace = trace
        # Clocks at stream positions are kept only where something waits on them; when the
        # trace is still growing we cannot know that, so keep them all.
        self.needed = positions
        self.clocks: Dict[int, VC] = {HOST: {HOST: 0}}
        self.at_position: Dict[Position, VC] = {}
        self.shadow: Dict[int, List[_Entry]] = {}
        self.found: Dict[tuple, Race] = {}
        self.consumed = 0
        self.allocs: Dict[int, AllocRecord] = {}  # sid -> its allocation (owners' sites)
        self.freed: Dict[int, VC] = {}  # sid -> what its free's recorded streams had done
        self.block_of: Dict[int, int] = {}  # sid -> block, for sids that reused one

    @property
    def races(self) -> List[Race]:
        return list(self.found.values())

    def update(self) -> List[Race]:
        log = self.trace.log
        for rec in log[self.consumed:]:
            self._feed(rec)
        self.consumed = len(log)
        return self.races

    def _feed(self, rec) -> None:
        host = self.clocks[HOST]
        if isinstance(rec, OpRecord):
            s = rec.stream
            vc = self.clocks.get(s)
            if vc is None:
                vc = self.clocks[s] = {}
            host[HOST] += 1
            _join(vc, host)
            vc[s] = rec.seq
            if rec.kind == _WAIT and rec.wait_for is not None:
                _join(vc, self.at_position.get(rec.wait_for, {}))
            if self.needed is None or (s, rec.seq) in self.needed:
                self.at_position[(s, rec.seq)] = dict(vc)
            actor = self.trace.stream_name(s)
            n = rec.seq
            for sid, lo, hi in rec.reads:
                self._check(s, n, vc, sid, lo, hi, False, rec, actor)
            for sid, lo, hi in rec.writes:
                self._check(s, n, vc, sid, lo, hi, True, rec, actor)
        elif isinstance(rec, HostAccess):
            host[HOST] += 1
            sid, lo, hi = rec.access
            self._check(HOST, host[HOST], host, sid, lo, hi, rec.write, rec, "host")
        elif isinstance(rec, SyncRecord):
            for pos in rec.waits:
                _join(host, self.at_position.get(pos, {}))
        elif isinstance(rec, QueryRecord):
            _join(host, self.at_position.get(rec.position, {}))
        elif isinstance(rec, AllocRecord):
            self.allocs[rec.sid] = rec
            if rec.prev is not None:
                self._reuse(rec)
        elif isinstance(rec, FreeRecord):
            done: VC = {}
            for pos in rec.waits:
                _join(done, self.at_position.get(pos, {}))
            self.freed[rec.sid] = done

    def _reuse(self, rec: AllocRecord) -> None:
        """Block ``rec.block`` passes from storage ``rec.prev`` to ``rec.sid``: carry over
        every access to it not ordered before the free's recorded streams' positions."""
        done = self.freed.pop(rec.prev, {})
        carried = []
        for e in self.shadow.pop(rec.prev, ()):
            if e.n <= done.get(e.actor, 0):
                continue  # record_stream: the allocator waited for this access
            carried.append(_Entry(e.actor, e.n, e.lo, e.hi, e.write, e.rec, e.name,
                                  rec.prev if e.owner is None else e.owner))
        if carried:
            self.shadow[rec.sid] = carried + self.shadow.get(rec.sid, [])
        self.block_of[rec.sid] = rec.block

    def _owner(self, sid: int) -> Owner:
        a = self.allocs.get(sid)
        return Owner(self.trace.storage_name(sid),
                     self.trace.stream_name(a.stream) if a is not None else None,
                     a.frame if a is not None else None)

    def _check(self, actor: int, n: int, vc: VC, sid: int, lo: int, hi: int, write: bool,
               rec, name: str) -> None:
        entries = self.shadow.get(sid)
        if not entries:  # first access of the storage (or all superseded): nothing to check
            self.shadow[sid] = [_Entry(actor, n, lo, hi, write, rec, name)]
            return
        keep: List[_Entry] = []
        info: Optional[AccessInfo] = None
        for e in entries:
            overlap = e.lo < hi and lo < e.hi
            ordered = e.actor == actor or e.n <= vc.get(e.actor, 0)
            if overlap and (e.write or write) and not ordered:
                kind = ("WAW" if write else "RAW") if e.write else "WAR"
                reuse = None
                if e.owner is not None:
                    reuse = Reuse(self.block_of.get(sid, -1), self._owner(e.owner),
                                  self._owner(sid))
                if info is None:
                    info = _Entry(actor, n, lo, hi, write, rec, name).info()
                race = Race(kind, self.trace.storage_name(sid), e.info(), info, reuse=reuse)
                old = self.found.get(race.key())
                if old is None:
                    self.found[race.key()] = race
                else:
                    old.count += 1
            covered = lo <= e.lo and e.hi <= hi
            # Superseded: ordered before this access and inside its range (a later access
            # racing with it would race with this one too). Writes survive reads, since a
            # later unordered read of their value is a race of its own.
            if ordered and covered and (write or not e.write):
                continue
            keep.append(e)
        keep.append(_Entry(actor, n, lo, hi, write, rec, name))
        self.shadow[sid] = keep


def detect(trace: Trace) -> List[Race]:
    """All unordered conflicting access pairs in a finished ``trace``, deduplicated by site."""
    return HBDetector(trace, _referenced_positions(trace)).update()


def _referenced_positions(trace: Trace) -> Set[Position]:
    needed: Set[Position] = set()
    for rec in trace.log:
        if isinstance(rec, OpRecord):
            if rec.wait_for is not None:
                needed.add(rec.wait_for)
        elif isinstance(rec, SyncRecord):
            needed.update(rec.waits)
        elif isinstance(rec, QueryRecord):
            needed.add(rec.position)
        elif isinstance(rec, FreeRecord):
            needed.update(rec.waits)
    return needed
