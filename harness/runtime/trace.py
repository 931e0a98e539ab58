"""The trace: what the host asked of the device, in host program order, plus what executed.

Both backends write the same records (one style: slotted dataclasses; ``Record`` is their
union, ``Trace.log`` a list of them), so one detector and one timeline serve both:

* ``OpRecord``     -- an operation enqueued on a stream (kernel, copy, wait marker, stall);
                      ``start``/``end`` are filled in when it executes (virtual microseconds
                      on the simulator, ``None`` on CUDA where nothing is timed per op).
* ``SyncRecord``   -- the host blocked until the listed stream positions had executed.
* ``QueryRecord``  -- ``event.query()`` / ``stream.query()`` returned True: a host
                      synchronisation as good as ``synchronize()`` (CSAN misses this).
* ``HostAccess``   -- the host read or wrote pinned host memory (CSAN misses this).
* ``EventRecord``  -- an event recorded on a stream (for the timeline's flow arrows).
* ``AllocRecord``  -- the caching allocator handed a block of device memory to a new
                      storage; ``prev`` names the storage that held the block before (a
                      reuse), so the detector can check the old owner's accesses against
                      the new owner's.
* ``FreeRecord``   -- a storage's block went back to its home stream's pool; ``waits`` are
                      the positions the recorded streams (``record_stream``) had reached,
                      which the allocator lets execute before it hands the block out again.
* ``RecordStreamRecord`` -- ``tensor.record_stream(stream)``.
* ``ReplayedOp``   -- an ``OpRecord`` issued by a CUDA graph replay: one of the ops the
                      graph captured, on the replaying stream; ``replay`` says where.

On the simulator the trace also holds the run's ``Schedule``: every answer its policy gave.

A *position* is ``(stream_id, seq)``: seq is the 1-based index of an op in its stream, and
position ``(s, n)`` is complete once the first ``n`` ops of stream ``s`` have executed.
An *access* is ``(sid, lo, hi)``: a storage id and a byte range within that storage.
"""
from __future__ import annotations

import enum
import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Dict, List, Optional, Sequence, Tuple, Union

from seams.paths import REPO_ROOT
from harness.runtime.policy import HOST, Schedule  # HOST: the host's actor id in vector clocks too
from seams.vocab import shaped_name

if TYPE_CHECKING:
    from types import CodeType
    import torch

Access = Tuple[int, int, int]  # (storage id, first byte, one past the last byte)
Position = Tuple[int, int]  # (stream id, seq)
Frame = Tuple[str, int, str]  # (file, line, function)


class OpKind(enum.StrEnum):
    """What an ``OpRecord`` is. A ``str`` enum: the Chrome trace writes the kind as it is
    (its ``cat``), and recorded trace digests hash that text, so it must stay the word."""

    KERNEL = "kernel"  # a launch (an aten op, a fused custom op)
    COPY = "copy"  # a transfer: D2H, H2D, ``.item()``
    WAIT = "wait"  # a ``wait_event`` marker: the stream waits for a recorded position
    STALL = "stall"  # a fault point holding the stream


# The names the runtime gives the ops it makes up (a kernel is named after its overload,
# ``add.Tensor``); both backends write them and every reader matches on them.
COPY_D2H = "copy D2H"
COPY_H2D = "copy H2D"
COPY_D2H_ITEM = "copy D2H (item)"
WAIT_EVENT = "wait_event"
STALL_OP = "stall"
HOST_READ, HOST_WRITE = "host read", "host write"  # a host access, as a race names it


# One record style: slotted, identity-compared dataclasses. Slots keep the simulator's
# per-op cost down (no instance dict to allocate); identity, because a record is one event
# at one place in the log -- two syncs alike in every field are still two syncs. Not
# frozen: ``Trace.add`` numbers each record, and an op is stamped (``seq``, ``enq``,
# ``start``/``end``) as it is enqueued and executed.
_record = dataclass(slots=True, eq=False)


@_record
class OpRecord:
    """One operation on a stream."""

    stream: int
    name: str
    reads: List[Access]
    writes: List[Access]
    frame: Optional[Frame]
    kind: str = OpKind.KERNEL
    wait_for: Optional[Position] = None
    duration: float = 1.0
    fn: Optional[Callable[[], Any]] = None  # the simulator's kernel, until it executes
    seq: int = field(default=0, init=False)  # 1-based in its stream, once enqueued
    enq: float = field(default=0.0, init=False)
    start: Optional[float] = field(default=None, init=False)
    end: Optional[float] = field(default=None, init=False)
    index: int = field(default=-1, init=False)  # position in the trace's log
    replay: ClassVar[Optional["Replay"]] = None  # a field of ``ReplayedOp`` only

    def __repr__(self) -> str:
        return f"<op {self.name} s{self.stream}#{self.seq} {self.kind}>"


@dataclass(frozen=True, slots=True)
class Replay:
    """Which replay of which graph issued an op, and where ``replay()`` was called."""
    graph: int
    n: int  # 1-based count of this graph's replays
    frame: Optional[Frame]


@dataclass(slots=True, eq=False, repr=False)  # a record, with ``OpRecord``'s repr
class ReplayedOp(OpRecord):
    """A captured op issued again by a graph replay. Its ``frame`` is the capture site (the
    line that launched the kernel while the graph was captured); ``replay.frame`` is the
    replay site. A subclass, so ordinary ops pay nothing for the extra field."""

    replay: Optional[Replay] = None


@_record
class SyncRecord:
    label: str
    waits: List[Position]
    frame: Optional[Frame]
    time: float = 0.0
    index: int = field(default=-1, init=False)


@_record
class QueryRecord:
    label: str
    position: Position
    frame: Optional[Frame]
    time: float = 0.0
    index: int = field(default=-1, init=False)


@_record
class HostAccess:
    access: Access
    write: bool
    name: str
    frame: Optional[Frame]
    time: float = 0.0
    index: int = field(default=-1, init=False)


@_record
class EventRecord:
    event: int
    position: Position
    frame: Optional[Frame]
    time: float = 0.0
    index: int = field(default=-1, init=False)


@_record
class AllocRecord:
    """Storage ``sid`` got block ``block`` (``nbytes``) from the pool of ``stream`` (the
    current stream at the allocation). ``prev``: the storage that last held the block.
    ``op``, ``dtype``, ``shape``: the op whose output it is, and the tensor's layout, for
    the storage's name in reports (``Trace.storage_name``; None: unnamed)."""

    block: int
    sid: int
    stream: int
    nbytes: int
    frame: Optional[Frame]
    prev: Optional[int] = None
    op: Optional[str] = None
    dtype: Optional[torch.dtype] = None
    shape: Optional[Sequence[int]] = None
    index: int = field(default=-1, init=False)

    def __repr__(self) -> str:
        return (f"<alloc block {self.block} -> sid {self.sid} on s{self.stream}"
                + (f", reusing sid {self.prev}>" if self.prev is not None else ">"))


@_record
class FreeRecord:
    """Storage ``sid`` freed on the host; its block returns to the pool of ``stream``.

    ``waits``: for each stream the storage was ``record_stream``-ed on, the position it
    had reached at the free; the block is not handed out before those have executed.
    ``frame`` is where the last reference died (None when the free was only inferred,
    as the CUDA capture does when it sees the block reused).
    """

    block: int
    sid: int
    stream: Optional[int]
    waits: Sequence[Position]
    frame: Optional[Frame]
    index: int = field(default=-1, init=False)

    def __repr__(self) -> str:
        return f"<free sid {self.sid} (block {self.block}) waits {self.waits}>"


@_record
class RecordStreamRecord:
    sid: int
    stream: int
    frame: Optional[Frame]
    index: int = field(default=-1, init=False)


# Every record a trace's log holds (a ``ReplayedOp`` is an ``OpRecord``).
Record = Union[OpRecord, SyncRecord, QueryRecord, HostAccess, EventRecord, AllocRecord,
               FreeRecord, RecordStreamRecord]


@dataclass
class Trace:
    """Everything one run asked of the device, in host order; ``executed`` in device order."""

    # the records as added (``log`` numbers them; read them there)
    records: List[Record] = field(default_factory=list)
    executed: List[OpRecord] = field(default_factory=list)
    stream_names: dict = field(default_factory=dict)
    storage_names: dict = field(default_factory=dict)  # sid -> "pinned int32[8]" etc.
    # the simulator's policy's answers as it gives them (a stream id, or HOST for "the host
    # goes on"; runtime/policy.py): a list, appended per question on the hot path; the
    # value is ``schedule``. Empty on CUDA, whose schedule is the GPU's.
    choices: List[int] = field(default_factory=list)

    numbered: int = field(default=0, init=False, repr=False)  # records[:numbered] have index
    # sid -> the ``AllocRecord`` that names it, of records[:named] (``storage_name``): an
    # allocation carries its op and layout, and the name is formatted only when a report
    # asks (a name, or a dict entry, per op would cost more than the op's bookkeeping)
    _sites: dict = field(default_factory=dict, init=False, repr=False)
    named: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        # ``add(rec)``: the records' own append. The hot path adds two or three records per
        # simulated op, and a method that also numbered each one cost ~10% of an op; a
        # record's ``index`` (its place in the log) is given when the log is read instead.
        self.add = self.records.append

    @property
    def log(self) -> List[Record]:
        """Every record in host order, each ``index`` set to its place in this list."""
        recs = self.records
        n = len(recs)
        if self.numbered < n:
            for i in range(self.numbered, n):
                recs[i].index = i
            self.numbered = n
        return recs

    @property
    def schedule(self) -> "Schedule":
        """The schedule that ran (so far)."""
        return Schedule(tuple(self.choices))

    def stream_name(self, sid: int) -> str:
        if sid == HOST:
            return "host"
        return self.stream_names.get(sid, f"stream{sid}")

    def storage_name(self, sid: int) -> str:
        name = self.storage_names.get(sid)
        if name is not None:
            return name
        recs = self.records
        if self.named < len(recs):
            sites = self._sites
            for rec in recs[self.named:]:
                if type(rec) is AllocRecord and rec.op is not None:
                    sites[rec.sid] = rec
            self.named = len(recs)
        site = self._sites.get(sid)
        if site is None:
            return f"storage {sid}"
        frame = site.frame
        where = f" at {short_path(frame[0])}:{frame[1]}" if frame else ""
        return f"{shaped_name(site.dtype, site.shape)} from {site.op}{where}"

    def ops(self) -> List[OpRecord]:
        return [r for r in self.log if isinstance(r, OpRecord)]


# ---------------------------------------------------------------------------------------
# Source frames: the innermost frame of user code (impl/, scenarios, tests), never the
# harness runtime or torch itself -- that is the line a race report must point at.

_TORCH_DIR = os.path.dirname(os.path.abspath(__import__("torch").__file__))
_RUNTIME_DIR = os.path.dirname(os.path.abspath(__file__))
_NUMPY_DIR = os.path.dirname(os.path.abspath(__import__("numpy").__file__))
# numpy's own Python (``a.sum()`` runs in ``numpy/_core/_methods.py``) is never the line
_SKIP_PREFIXES = (_TORCH_DIR, _NUMPY_DIR, _RUNTIME_DIR, os.path.dirname(os.__file__))


# Asked two or three times per simulated op, so both answers are cached per code object:
# whether it is user code, and each call site's ``Frame`` by instruction offset (a frame's
# ``f_lineno`` decodes the line table at every read; ``f_lasti`` is a plain field). Keyed
# by ``id(code)``, since hashing a code object hashes its bytecode; ``_HELD`` keeps every
# cached code alive, so no other code can get its id while the entry stands. Bounded: code
# compiled at run time (source patches) would otherwise be kept forever.
_SITES: Dict[int, Optional[Dict[int, Frame]]] = {}  # None: not user code
_HELD: Dict[int, Any] = {}
_CODES_MAX = 1 << 14
_UNSEEN: Any = object()


def _learn(code: CodeType) -> Optional[Dict[int, Frame]]:
    if len(_SITES) >= _CODES_MAX:
        _SITES.clear()
        _HELD.clear()
    fn = code.co_filename
    _HELD[id(code)] = code
    sites = _SITES[id(code)] = (None if fn.startswith(_SKIP_PREFIXES) or fn.startswith("<")
                                else {})
    return sites


# The code object asked last and its sites: the calls come in runs from one user function
# (a loop issuing ops), and ``id()`` and the lookup cost more than the rest of the call.
# One tuple, so a thread reading it never pairs one code with another's sites.
_LAST: Tuple[Any, Optional[Dict[int, Frame]]] = (None, None)
_getframe = sys._getframe


def user_frame(depth: int = 2) -> Optional[Frame]:
    """The innermost caller outside torch, the stdlib and the runtime package."""
    global _LAST
    f = _getframe(depth)
    while f is not None:
        code = f.f_code
        last = _LAST
        if code is last[0]:
            sites = last[1]
        else:
            sites = _SITES.get(id(code), _UNSEEN)
            if sites is _UNSEEN:
                sites = _learn(code)
            _LAST = (code, sites)
        if sites is not None:
            lasti = f.f_lasti
            site = sites.get(lasti)
            if site is None:
                site = sites[lasti] = (code.co_filename, f.f_lineno, code.co_name)
            return site
        f = f.f_back
    return None


_SITE_DIRS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)
_ROOT = REPO_ROOT


def short_path(path: str) -> str:
    """Path relative to the project root when inside it, relative to the install root for
    an installed package (``sglang/srt/...``, never an absolute install path): a
    site-packages folder, or any other ``sys.path`` entry it was imported from (``pip
    install --target DIR``)."""
    for marker in _SITE_DIRS:
        i = path.rfind(marker)
        if i >= 0:
            return path[i + len(marker):]
    if path.startswith(_ROOT + os.sep):
        return path[len(_ROOT) + 1:]
    best = ""
    for entry in sys.path:
        entry = os.path.abspath(entry) if entry else ""
        if entry and entry != os.sep and path.startswith(entry + os.sep) and len(entry) > len(best):
            best = entry
    return path[len(best) + 1:] if best else path


def access_label(write: bool) -> str:
    """The one spelling of an access's kind in every report and message."""
    return "write" if write else "read"


def frame_text(frame: Optional[Frame], missing: Optional[str] = "?",
               function: bool = True) -> Optional[str]:
    """How every report names a site: ``file:line (function)``, the file project-relative
    (``short_path``); ``missing`` when there is no frame."""
    if not frame:
        return missing
    head = f"{short_path(frame[0])}:{frame[1]}"
    return f"{head} ({frame[2]})" if function else head


def tensor_range(t: torch.Tensor) -> Tuple[int, int]:
    """Byte range ``[lo, hi)`` a tensor view covers in its storage (conservative for strides)."""
    n = t.numel()
    item = t.element_size()
    lo = t.storage_offset() * item
    if n == 0:
        return lo, lo
    span = 1
    for size, stride in zip(t.shape, t.stride()):
        if size > 1:
            span += (size - 1) * abs(stride)
    return lo, lo + span * item
