"""What makes a call an ordering site: the census's kinds and the rule for each.

Static reading cannot know a receiver's type, so each rule is written from what the
serving code calls its objects, and the census says so (docs/census.md). The rules:

* ``stream-create``: a call of ``Stream`` (``torch.cuda.Stream()``,
  ``device_module.Stream()``, ``torch.Stream()``).
* ``stream-switch``: ``stream(...)`` / ``set_stream(...)`` on a device module
  (``torch.cuda``, ``torch.npu``, ``device_module``, ``torch.get_device_module(d)``,
  ``current_platform``) or imported from ``torch.cuda``.
* ``current-stream``: ``current_stream()`` / ``default_stream()`` on a device module.
* ``wait-stream`` / ``wait-event``: every ``.wait_stream(...)`` / ``.wait_event(...)``,
  and ``.wait([stream])`` on an event (below).
* ``event-record`` / ``event-query``: ``.record([stream])`` / ``.query()`` on an event.
* ``event-sync``: ``.synchronize()`` on an event or a stream (a name with ``stream`` in
  it, ``current_stream()``): the host waits for it.  ``device-sync``: ``synchronize()``
  on a device module.
* ``record-stream``: every ``.record_stream(...)``.
* ``non-blocking-copy``: any call passing ``non_blocking=`` other than a literal False.
* ``pinned-alloc``: ``.pin_memory()`` and any call passing ``pin_memory=`` other than a
  literal False/None; a call of a pinned-buffer factory the target names
  (``CpuGpuBuffer``) assigns a pinned buffer too.
* ``pinned-host-write``: a subscript store, augmented assignment, or in-place
  ``copy_``/``fill_``/``zero_`` (no ``non_blocking``) into a name or ``self.X`` the same
  function (name) or class (``self.X``) bound to a pinned allocation -- through ``.np`` /
  ``.cpu`` / ``.numpy()`` views too. Only what one file shows: a buffer pinned in one
  class and written in another is not seen.
* ``graph-capture``: ``graph(...)`` on a device module, a ``CUDAGraph``-like
  constructor, ``capture_begin`` / ``capture_end``.  ``graph-replay``: ``.replay()``.
  ``graph-pool``: the pool's API (``graph_pool_handle()``, ``get_/set_/create_`` ...
  ``graph_memory_pool``, ``borrow_graph_pool``).
* ``sync-readback`` (only when asked): ``.item()``, ``.tolist()``, ``.cpu()`` on a
  receiver whose name does not say it is on the host (``*_cpu``, ``host``, ``np``).

An *event* is a name bound from an ``Event(...)`` call that is not ``threading`` /
``asyncio`` / ``multiprocessing``'s, a name annotated as a torch event, or one named
like one (``*event*``, ``*_done``, ``*ready*``, ``ev``) that the file does not bind to a
threading event.
"""
from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Set, Tuple

KINDS = ("stream-create", "stream-switch", "current-stream", "wait-stream", "wait-event",
         "event-record", "event-query", "event-sync", "record-stream", "non-blocking-copy",
         "pinned-alloc", "pinned-host-write", "graph-capture", "graph-replay", "graph-pool",
         "device-sync", "sync-readback")

DEVICE_MODULES = frozenset({"cuda", "npu", "xpu", "hpu", "musa", "mlu", "mps",
                            "device_module", "_device_module", "current_platform",
                            "get_device_module", "torch_npu"})
HOST_EVENT_MODULES = frozenset({"threading", "asyncio", "multiprocessing", "mp", "ctx",
                                "mp_ctx", "trio", "gevent", "eventlet"})
GRAPH_CLASSES = re.compile(r"^(\w*CUDAGraph|NPUGraph|XPUGraph|HPUGraph|MUSAGraph)$")
EVENT_NAME = re.compile(r"(event|(^|_)done$|ready|^ev$|_ev$|^evt$)", re.I)
NOT_EVENT_NAME = re.compile(r"(cond|cv$|future|thread|shutdown|stop|lock|queue|sem|barrier)", re.I)
# the graph memory pool's own API (not every helper whose name mentions it)
GRAPH_POOL = re.compile(r"graph_pool_handle$|^_?(get|set|get_or_create|create)_(global_)?"
                        r"graph_(memory_)?pool(_id)?$|^borrow_graph_pool$")
HOST_NAME = re.compile(r"(cpu|host|(^|_)np($|_)|numpy|list)", re.I)
IN_PLACE = frozenset({"copy_", "fill_", "zero_", "index_copy_", "masked_fill_",
                      "index_fill_", "scatter_", "fill"})
VIEWS = frozenset({"np", "cpu", "numpy", "gpu_buffer_cpu"})
# A file whose text has none of these cannot hold a site (each rule needs one of the
# words): the census parses only files that do.
_TRIGGER = re.compile(r"\b(\w*Stream|stream|set_stream|current_stream|default_stream|"
                      r"wait_stream|wait_event|wait|record|query|synchronize|record_stream|"
                      r"graph|\w*Graph|capture_begin|capture_end|replay|\w*graph_pool\w*|"
                      r"\w*graph_memory_pool\w*|pin_memory)\s*\(|\b(non_blocking|pin_memory)"
                      r"\s*=")
_READBACK = re.compile(r"\.(item|tolist|cpu)\s*\(")
# a call of ``pin_memory=`` that passes a literal False or None pins nothing
_OFF = (False, None)


def might_have_sites(text: str, readbacks: bool = False,
                     factories: Tuple[str, ...] = ()) -> bool:
    """Can ``text`` hold a site at all (a cheap test before parsing)?"""
    return bool(_TRIGGER.search(text) or (readbacks and _READBACK.search(text))
                or any(f in text for f in factories))


def chain(node: ast.AST) -> str:
    """``torch.get_device_module().stream`` for an attribute chain (calls as ``()``,
    subscripts as ``[]``); ``?`` for anything else at its root. Iterative: bounded by
    the tree's own depth bound."""
    parts: List[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            parts.append("()")
            node = node.func
        elif isinstance(node, ast.Subscript):
            parts.append("[]")
            node = node.value
        elif isinstance(node, ast.Name):
            parts.append(node.id)
            break
        else:
            parts.append("?")
            break
    out = ""
    for p in reversed(parts):
        out += p if p in ("()", "[]") or not out else "." + p
    return out


def _last(recv: str) -> str:
    """The last named component of a receiver chain: ``a.b()[]`` -> ``b``."""
    return re.sub(r"(\(\)|\[\])+$", "", recv).rsplit(".", 1)[-1]


def is_device_module(recv: str) -> bool:
    return recv == "torch" or _last(recv) in DEVICE_MODULES


def _kw_on(call: ast.Call, name: str) -> bool:
    """The call passes ``name=`` with anything but a literal False / None."""
    return any(k.arg == name and not (isinstance(k.value, ast.Constant)
                                      and k.value.value in _OFF) for k in call.keywords)


def _target_names(targets: List[ast.AST]) -> List[Tuple[str, str]]:
    """("self", X) for ``self.X`` targets, ("", N) for plain names, tuples unpacked."""
    out: List[Tuple[str, str]] = []
    todo = list(targets)
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo.extend(t.elts)
        elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                and t.value.id == "self":
            out.append(("self", t.attr))
        elif isinstance(t, ast.Name):
            out.append(("", t.id))
    return out


def _root(node: ast.AST) -> Optional[Tuple[str, str]]:
    """The buffer a write goes into, through views: ``self.buf.np[:n]`` -> ("self",
    "buf"); ``buf[i]`` -> ("", "buf")."""
    while True:
        if isinstance(node, ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in VIEWS and not node.args:
            node = node.func.value
        elif isinstance(node, ast.Attribute) and node.attr in VIEWS:
            node = node.value
        else:
            break
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
            and node.value.id == "self":
        return ("self", node.attr)
    if isinstance(node, ast.Name):
        return ("", node.id)
    return None


@dataclass
class FileFacts:
    """What one file binds: its torch events and threading events by name, and its
    pinned buffers (``(class, attr)`` for ``self.X``, ``(function, name)`` for names)."""
    events: Set[str] = field(default_factory=set)
    host_events: Set[str] = field(default_factory=set)
    pinned: Set[Tuple[str, str]] = field(default_factory=set)
    torch_imports: FrozenSet[str] = frozenset()  # names imported from torch.cuda / torch
    bare_event_is_host: bool = False  # ``from threading import Event``
    factories: Tuple[str, ...] = ()  # calls that return a pinned buffer (the target's)

    @classmethod
    def build(cls, imports: List[ast.ImportFrom], assigns: List[Tuple[ast.stmt, str, str]],
              factories: Tuple[str, ...] = ()) -> "FileFacts":
        """From a file's ``from X import ...`` statements and its assignments, each with
        its class and qualified function (the census's one walk collects them)."""
        facts = cls(factories=tuple(factories))
        names: Set[str] = set()
        for n in imports:
            imported = {a.asname or a.name for a in n.names}
            if n.module and n.module.split(".")[0] in HOST_EVENT_MODULES \
                    and "Event" in imported:
                facts.bare_event_is_host = True
            if n.module in ("torch.cuda", "torch", "torch.npu"):
                names |= imported
        facts.torch_imports = frozenset(names)
        for node, klass, fn in assigns:
            if node.value is not None:
                facts._bind(node, klass, fn, factories)
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, (ast.Name,
                                                                            ast.Attribute)):
                ann = ast.dump(node.annotation)
                if "'Event'" in ann and ("'cuda'" in ann or "'torch'" in ann):
                    facts.events.add(_last(chain(node.target)))
        return facts

    def _bind(self, node, klass: str, fn: str, factories: Tuple[str, ...]) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        names = _target_names(targets)
        calls = [c for c in ast.walk(node.value) if isinstance(c, ast.Call)]
        for c in calls:
            name = c.func.attr if isinstance(c.func, ast.Attribute) else \
                c.func.id if isinstance(c.func, ast.Name) else ""
            if name == "Event":
                recv = chain(c.func.value) if isinstance(c.func, ast.Attribute) else ""
                host = (recv.split(".")[0] in HOST_EVENT_MODULES if recv
                        else self.bare_event_is_host)
                (self.host_events if host else self.events).update(n for _, n in names)
            pinned = (_kw_on(c, "pin_memory") or name == "pin_memory" or name in factories)
            if pinned:
                for owner, n in names:
                    self.pinned.add((klass, n) if owner == "self" else (fn, n))

    def is_event(self, recv: str) -> bool:
        last = _last(recv)
        if last in self.host_events or recv.split(".")[0] in HOST_EVENT_MODULES:
            return False
        return last in self.events or (bool(EVENT_NAME.search(last))
                                       and not NOT_EVENT_NAME.search(last))

    def is_pinned(self, root: Optional[Tuple[str, str]], klass: str, fn: str) -> bool:
        if root is None:
            return False
        owner, name = root
        return ((klass, name) if owner == "self" else (fn, name)) in self.pinned

    def host_write(self, stmt: ast.stmt, klass: str, fn: str) -> Optional[str]:
        """``pinned-host-write`` for a store into a pinned buffer, else None."""
        if isinstance(stmt, ast.Assign):
            targets = stmt.targets
        elif isinstance(stmt, (ast.AugAssign, ast.AnnAssign)):
            targets = [stmt.target]
        else:
            return None
        for t in targets:
            if isinstance(t, ast.Subscript) and self.is_pinned(_root(t), klass, fn):
                return "pinned-host-write"
            if isinstance(stmt, ast.AugAssign) and self.is_pinned(_root(t), klass, fn):
                return "pinned-host-write"
        return None


def _call_name(call: ast.Call) -> Tuple[str, str]:
    """(the called name, its receiver chain; "" for a bare name)."""
    if isinstance(call.func, ast.Attribute):
        return call.func.attr, chain(call.func.value)
    if isinstance(call.func, ast.Name):
        return call.func.id, ""
    return "", ""


def _stream_api(name: str, recv: str, facts: FileFacts) -> bool:
    return is_device_module(recv) if recv else name in facts.torch_imports


def kinds_of(call: ast.Call, facts: FileFacts, klass: str, fn: str,
             readbacks: bool = False) -> List[str]:
    """Every kind the call is (one call may be several: a pinned non-blocking copy)."""
    name, recv = _call_name(call)
    out: List[str] = []
    nargs = len(call.args) + len(call.keywords)
    if name in ("Stream", "ExternalStream"):
        out.append("stream-create")
    elif name in ("stream", "set_stream") and _stream_api(name, recv, facts):
        out.append("stream-switch")
    elif name in ("current_stream", "default_stream") and _stream_api(name, recv, facts):
        out.append("current-stream")
    elif name == "wait_stream":
        out.append("wait-stream")
    elif name == "wait_event" or (name == "wait" and recv and nargs <= 1
                                  and facts.is_event(recv)):
        out.append("wait-event")
    elif name == "record" and recv and nargs <= 1 and facts.is_event(recv):
        out.append("event-record")
    elif name == "query" and recv and not nargs and (facts.is_event(recv)
                                                     or "stream" in _last(recv).lower()):
        out.append("event-query")
    elif name == "synchronize" and not call.args:
        if _stream_api(name, recv, facts):
            out.append("device-sync")
        elif recv and (facts.is_event(recv) or "stream" in _last(recv).lower()):
            out.append("event-sync")  # an event or a stream; a C++ corpus's is not one
    elif name == "record_stream":
        out.append("record-stream")
    elif (name == "graph" and _stream_api(name, recv, facts)) or GRAPH_CLASSES.match(name) \
            or name in ("capture_begin", "capture_end"):
        out.append("graph-capture")
    elif name == "replay" and recv and "deepep" not in recv:  # DeepEP's replay: no graph
        out.append("graph-replay")
    elif GRAPH_POOL.search(name):
        out.append("graph-pool")
    elif readbacks and name in ("item", "tolist", "cpu") and recv and not call.args \
            and not HOST_NAME.search(recv):
        out.append("sync-readback")
    if _kw_on(call, "non_blocking"):
        out.append("non-blocking-copy")
    if _kw_on(call, "pin_memory") or (name == "pin_memory" and recv) \
            or (name in facts.factories and name):
        out.append("pinned-alloc")
    if name in IN_PLACE and recv and not _kw_on(call, "non_blocking") \
            and isinstance(call.func, ast.Attribute) \
            and facts.is_pinned(_root(call.func.value), klass, fn):
        out.append("pinned-host-write")
    return out


# --- why a site does not run: the categories a target's reason rules name ---------------
# Sites in the first two are not on a single-node CUDA server's paths: the headline
# (``targets.coverage``) leaves them out of its denominator.
HARDWARE = "hardware specrace does not model (NPU/HIP/XPU/CPU branches)"
MULTI_NODE = "multi-node / transfer engine"
CONFIG = "configuration not driven"
NOT_REACHED = "not reached by any scenario"
OFF_NODE = (HARDWARE, MULTI_NODE)

# A target's reason rule: (category, what it reads -- path / function / guard / text --,
# pattern, its own words: which configuration or hardware the site needs)
Rule = Tuple[str, str, str, str]


def rules(category: str, words: str, *reads: Tuple[str, str]) -> Tuple[Rule, ...]:
    """The rules of one reason, one per (what it reads, pattern) of ``reads``, in order."""
    return tuple((category, what, pattern, words) for what, pattern in reads)
