"""Reports of a ``specrace repro`` run: JSON (replayable), Markdown, a Chrome trace, a PNG.

``write_reports(result, report_dir)`` writes a ``ReproResult`` as one set: the folder
``REPORT_DIR/NAME/``, swapped in whole by one rename (``reportset``: a reader sees the
previous set or this one, never a mix). ``NAME`` (``report_name``) carries every setting
that changes the run -- readable, ``{scenario}[-{target}]-{variant}[-{war_barrier}]-
{backend}[-{policy}]-stall{ms|auto}-t{trials}-seed{seed}``, then a digest of all of them
(the stall plan and host-order answers too), so two runs share a name only if they are the
same run:

* ``report.json``   the result, plus the format version, the environment and the replay
                    command (``document.Report``; ``specrace replay NAME/report.json``);
* ``report.md``     a person's summary: verdict, what raced with what, first divergence;
* ``trace.json``    Chrome trace-event format (ui.perfetto.dev, chrome://tracing);
* ``timeline.png``  the timeline around the first race, one lane per stream + the host.

The last two show the result's ``trace`` (the first failing trial, or trial 0) and its
``trace_races``; with no trace they are skipped (``None`` in the set's files). Every file
carries the set's ``run_id`` (a digest of the JSON report's content).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shlex
from typing import TYPE_CHECKING, Any, BinaryIO, Dict, List, Optional

from seams import signals
from seams.paths import REPO_ROOT

from harness.report.document import REPORT_FORMAT, Report, content_id
from harness.report.reportset import ReportDirError, prepare_report_dir, write_set
from seams.vocab import FENCED_TARGETS, Backend

if TYPE_CHECKING:
    from harness.trials.results import ReproResult

FILES = {"json": "report.json", "markdown": "report.md", "trace": "trace.json",
         "timeline": "timeline.png"}
MAX_READABLE = 120  # characters of a name's readable part (the digest follows)

__all__ = ["write_reports", "report_name", "environment", "REPORT_FORMAT", "Report",
           "check_report_dir", "ReportDirError", "FILES", "preload"]


def report_name(identity: Dict[str, Any]) -> str:
    """The set's folder name from a run's identity (``ReproResult.identity()``, or
    ``Run.identity()`` before the run: the same dict)."""
    ms = identity.get("stall_ms")
    parts = [identity["scenario"]]
    if identity.get("target", "impl") != "impl":
        parts.append(identity["target"])
        version = (identity.get("code") or {}).get(f"{identity['target']}_version")
        if version:
            parts.append(str(version))
    parts.append(identity["variant"])
    if identity.get("target", "impl") in FENCED_TARGETS:  # a word of its server's only
        parts.append(identity["war_barrier"])
    parts.append(identity["backend"])
    parts += [identity[k] for k in ("platform", "load") if k in identity]
    if identity["backend"] == Backend.SIM:
        parts.append(str(identity["policy"]))
    parts += ["stallauto" if ms is None else f"stall{float(ms):g}ms",
              f"t{identity['trials']}", f"seed{identity['seed']}"]
    readable = re.sub(r"[^A-Za-z0-9.-]+", "_", "-".join(map(str, parts))).strip("_.")
    text = json.dumps(identity, sort_keys=True, default=str)
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:10]
    return f"{readable[:MAX_READABLE]}-{digest}"


LONGEST_NAME = "x" * (MAX_READABLE + 11)


def check_report_dir(report_dir: str) -> str:
    """Create ``report_dir`` if needed and prove a set can be written there
    (``ReportDirError``, one line, if not): call it before the run."""
    return prepare_report_dir(report_dir, LONGEST_NAME)


def preload() -> None:
    """Import what writing a set needs, before its critical section (``reportset``): a
    signal is not deferred in the middle of an import, nor an import begun inside."""
    import matplotlib.backends.backend_agg  # noqa: F401 -- what render_timeline imports
    import matplotlib.figure  # noqa: F401
    import matplotlib.lines  # noqa: F401
    import matplotlib.patches  # noqa: F401
    import matplotlib.text  # noqa: F401
    import PIL.Image

    from harness.report import chrome, markdown, timeline  # noqa: F401
    PIL.Image.preinit()  # savefig's PNG writer loads PIL's common plugins on first use


def write_reports(result: ReproResult, report_dir: str,
                  context: Optional[Dict[str, Any]] = None) -> Dict[str, Optional[str]]:
    """Write ``result``'s set (a ``ReproResult``); returns each file's path by kind.
    ``context``: what the caller knows of the run beyond it, for the Markdown only (the
    JSON, which replay reads, is the run's alone) -- ``configuration`` (the server flags
    that reach it) and ``known`` (the known races it matched, each with its write-up)."""
    with signals.deferred():  # an import is not a place for an exception
        preload()
    from harness.report.chrome import chrome_trace, trace_digest
    from harness.report.markdown import render_markdown
    from harness.report.timeline import render_timeline

    check_report_dir(report_dir)
    name = report_name(result.identity())
    folder = os.path.join(report_dir, name)
    trace, races = result.trace, list(result.trace_races or [])
    have = {"json", "markdown"} | ({"trace", "timeline"} if trace is not None else set())
    paths: Dict[str, Optional[str]] = {
        k: (os.path.join(folder, fn) if k in have else None) for k, fn in FILES.items()}
    digest = trace_digest(trace, races) if trace is not None else None
    report = Report(result, environment(), "specrace replay " + shlex.quote(paths["json"]),
                    {k: (os.path.basename(v) if v else None) for k, v in paths.items()},
                    digest)
    report = dataclasses.replace(report, run_id=content_id(report.to_json()))
    doc = report.to_json()

    members = []
    notes: Dict[str, Any] = {}
    if trace is not None:
        chrome = chrome_trace(trace, races, report)
        members.append((FILES["trace"], lambda f: f.write(
            json.dumps(chrome, default=str, separators=(",", ":")).encode())))

        def timeline(f: BinaryIO) -> None:
            notes["timeline"] = render_timeline(trace, races, report, f)
        members.append((FILES["timeline"], timeline))

    def markdown(f: BinaryIO) -> None:
        f.write(render_markdown(report, paths, notes.get("timeline"), context).encode())
    members.append((FILES["markdown"], markdown))
    members.append((FILES["json"], lambda f: f.write(
        (json.dumps(doc, indent=1, default=str) + "\n").encode())))
    write_set(report_dir, name, members)
    return paths


# --- environment ------------------------------------------------------------------------

_ENV_CACHE: Dict[str, Any] = {}


def environment() -> Dict[str, Any]:
    """Where the run happened: python, platform, torch, CUDA/GPU, xgrammar, specrace."""
    if _ENV_CACHE:
        return dict(_ENV_CACHE)
    import platform
    env: Dict[str, Any] = {"python": platform.python_version(),
                           "platform": platform.platform()}
    try:
        import torch
        env["torch"] = torch.__version__
        cuda = bool(torch.cuda.is_available())
        env["cuda_available"] = cuda
        env["cuda"] = torch.version.cuda if cuda else None
        env["gpu"] = torch.cuda.get_device_name(0) if cuda else None
        env["driver"] = _nvidia_driver() if cuda else None
    except Exception as exc:  # pragma: no cover - torch is a hard dependency
        env["torch"] = f"unavailable ({type(exc).__name__})"
    env["xgrammar"] = _dist_version("xgrammar")
    env["specrace"] = _dist_version("specrace") or _pyproject_version()
    env["git_commit"] = _git_commit()
    env["python_hash_seed"] = python_hash_seed()
    _ENV_CACHE.update(env)
    env = dict(env)
    env["source_digest"] = source_digest()  # not cached: the code may change in a process
    return env


def python_hash_seed() -> str:
    """The hash seed this process runs under, which the order of set iteration in the code
    under test follows ("random": none fixed; the console pins 0 so that a report replays
    to its own trace)."""
    return os.environ.get("PYTHONHASHSEED") or "random"


def source_digest() -> str:
    """sha256 over the Python sources of toys/, impl/, harness/, scenarios/, litmus/, matrix/
    and targets/ (every file a run of ours executes): a replay that disagrees can say whether
    the code changed since the report was written."""
    import hashlib
    h = hashlib.sha256()
    root = REPO_ROOT
    for top in ("toys", "impl", "harness", "scenarios", "litmus", "matrix", "targets"):
        base = os.path.join(root, top)
        for folder, dirs, files in sorted(os.walk(base)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            for fn in sorted(files):
                if not fn.endswith(".py"):
                    continue
                path = os.path.join(folder, fn)
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                h.update(os.path.relpath(path, root).encode() + b"\0")
                h.update(hashlib.sha256(data).digest())
    return h.hexdigest()


def _dist_version(name: str) -> Optional[str]:
    from importlib import metadata
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _pyproject_version() -> Optional[str]:
    try:
        with open(os.path.join(REPO_ROOT, "pyproject.toml"), encoding="utf-8") as f:
            m = re.search(r'^version\s*=\s*"([^"]+)"', f.read(), re.M)
        return m.group(1) if m else None
    except OSError:
        return None


def _run(cmd: List[str]) -> Optional[str]:
    import shutil
    import subprocess
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=REPO_ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _nvidia_driver() -> Optional[str]:
    return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def _git_commit() -> Optional[str]:
    if not os.path.exists(os.path.join(REPO_ROOT, ".git")):
        return None
    return _run(["git", "rev-parse", "HEAD"])
