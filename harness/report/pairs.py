"""Racing pairs: a run's race sites grouped by the two places in the code that race --
what a row of ``specrace audit`` or ``specrace releases`` names.

The detector records a *site* per distinct pair of accesses (op, stream, frame, buffer),
so one bug often shows as several sites: the three buffers a readback copies, each
written by its own op inside one graph replay. A row names the code, not the buffer:
sites are grouped by where each access was issued on the host (for an op of a CUDA graph,
the replay that ran it), and a race across an allocator reuse by the pending access and
where the freed block was allocated (whatever took the block next is incidental). Two
groups on one run are two rows.

Works on the races' JSON (``Race.to_json()``, as a report and ``repro --json`` carry
them), so a parent reading a child's output groups them the same way.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

Site = Tuple[Optional[str], Optional[int], Optional[str]]  # file, line, function


def _site(doc: Dict[str, Any], launched: bool = True) -> Site:
    """Where an access was issued: the replay that ran it when it is a graph's op
    (``launched``), else its own frame."""
    at = doc.get("replayed_at") if launched else None
    src = at if isinstance(at, dict) else doc
    return (src.get("file"), src.get("line"), src.get("function"))


def site_text(site: Site) -> str:
    file, line, fn = site
    if file is None:
        return "an unknown site"
    return f"{file}:{line}" + (f" ({fn})" if fn else "")


def frames(race: Dict[str, Any]) -> List[Tuple[str, str]]:
    """Every (file, function) a race names: both accesses (captured and replayed) and,
    across a reuse, where the freed block was allocated -- what a known finding is
    matched against."""
    out = []
    for key in ("first", "second"):
        acc = race.get(key) or {}
        for doc in (acc, acc.get("replayed_at") or {}):
            if doc.get("file"):
                out.append((doc["file"], doc.get("function") or ""))
    old = ((race.get("reuse") or {}).get("old")) or {}
    if old.get("file"):
        out.append((old["file"], old.get("function") or ""))
    return out


def _key(race: Dict[str, Any]) -> tuple:
    first = race.get("first") or {}
    if race.get("reuse"):
        old = race["reuse"].get("old") or {}
        return ("reuse", _site(first), (old.get("file"), old.get("line"), old.get("function")))
    ends = sorted([_site(first), _site(race.get("second") or {})], key=repr)
    return ("pair", *ends)


def group(races: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The racing pairs of a run's race sites, in the order each was first recorded."""
    pairs: Dict[tuple, Dict[str, Any]] = {}
    for race in races:
        if not isinstance(race, dict):
            continue
        key = _key(race)
        pair = pairs.get(key)
        if pair is None:
            pair = pairs[key] = {"kind": race.get("kind"), "sites": 0, "count": 0,
                                 "storages": [], "races": [], "text": _text(race)}
        pair["sites"] += 1
        pair["count"] += race.get("count", 1) if isinstance(race.get("count"), int) else 1
        if race.get("storage") not in pair["storages"]:
            pair["storages"].append(race.get("storage"))
        pair["races"].append(race)
    return list(pairs.values())


def _access(acc: Dict[str, Any]) -> str:
    launched = isinstance(acc.get("replayed_at"), dict)
    where = site_text(_site(acc))
    graph = f", a graph replay of {site_text(_site(acc, launched=False))}" if launched else ""
    return f"{acc.get('actor', '?')} {acc.get('access', '?')} at {where}{graph}"


def _text(race: Dict[str, Any]) -> str:
    """One line: what raced with what, at upstream's lines (the pending access first)."""
    first, second = race.get("first") or {}, race.get("second") or {}
    if race.get("reuse"):
        old = race["reuse"].get("old") or {}
        freed = site_text((old.get("file"), old.get("line"), old.get("function")))
        return (f"{race.get('kind')} across a block reuse: {_access(first)}, on a block "
                f"allocated at {freed} that was freed and handed to "
                f"{second.get('actor', '?')} before the access ran")
    return f"{race.get('kind')}: {_access(first)} vs {_access(second)}"
