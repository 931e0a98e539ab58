"""Reports of a ``specrace repro`` run: JSON (replayable), Markdown, a Chrome trace, a PNG.

``write_reports(result, trace, races, report_dir)`` writes, each atomically (a temp file in
the same folder, then ``os.replace``), under the base name
``{scenario}-{variant}-{war_barrier}-{backend}-seed{seed}``:

* ``NAME.json``        the result dict, plus the format version, the environment and the
                       replay command (``specrace replay NAME.json`` re-runs it);
* ``NAME.md``          a person's summary: verdict, what raced with what, first divergence;
* ``NAME.trace.json``  Chrome trace-event format (ui.perfetto.dev, chrome://tracing);
* ``NAME.png``         the timeline around the first race, one lane per stream + the host.

``trace`` is the trace of the first failing trial (or trial 0) and ``races`` the races
found in *that* trace; with no trace the last two are skipped (``None`` in the result).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import tempfile
from typing import Any, Callable, Dict, List, Optional

REPORT_FORMAT = 1

__all__ = ["write_reports", "report_name", "environment", "REPORT_FORMAT"]


def report_name(result: Dict[str, Any]) -> str:
    target = result.get("target") or "impl"
    name = (f"{result.get('scenario')}{'' if target == 'impl' else '-' + target}-"
            f"{result.get('variant')}-{result.get('war_barrier')}-"
            f"{result.get('backend')}-seed{result.get('seed')}")
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)


def write_reports(result: Dict[str, Any], trace: Any, races: Optional[List[Any]],
                  report_dir: str) -> Dict[str, Optional[str]]:
    from .markdown import render_markdown

    os.makedirs(report_dir, exist_ok=True)
    name = report_name(result)
    paths: Dict[str, Optional[str]] = {
        "json": os.path.join(report_dir, name + ".json"),
        "markdown": os.path.join(report_dir, name + ".md"),
        "trace": os.path.join(report_dir, name + ".trace.json") if trace is not None else None,
        "timeline": os.path.join(report_dir, name + ".png") if trace is not None else None,
    }
    races = list(races or [])
    report = {"specrace_report": REPORT_FORMAT}
    report.update({k: v for k, v in result.items() if k != "report_files"})
    report["environment"] = environment()
    report["replay"] = {"command": "specrace replay " + shlex.quote(paths["json"])}
    report["report_files"] = {k: (os.path.basename(v) if v else None) for k, v in paths.items()}

    timeline_note = None
    if trace is not None:
        from .chrome import chrome_trace
        from .timeline import render_timeline

        doc = chrome_trace(trace, races, result)
        _atomic_write(paths["trace"], lambda f: f.write(
            json.dumps(doc, default=str, separators=(",", ":")).encode()))
        timeline_note = _atomic_write(paths["timeline"],
                                      lambda f: render_timeline(trace, races, result, f))

    _atomic_write(paths["json"], lambda f: f.write(
        (json.dumps(report, indent=1, default=str) + "\n").encode()))
    md = render_markdown(report, paths, trace, races, timeline_note)
    _atomic_write(paths["markdown"], lambda f: f.write(md.encode()))
    return paths


def _atomic_write(path: str, write: Callable[[Any], Any]) -> Any:
    """Write ``path`` through a temp file in the same folder, then rename it into place."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                               dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            ret = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return ret


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
    _ENV_CACHE.update(env)
    env = dict(env)
    env["source_digest"] = source_digest()  # not cached: the code may change in a process
    return env


def source_digest() -> str:
    """sha256 over the Python sources of impl/, harness/ and scenarios/: a replay that
    disagrees can say whether the code changed since the report was written."""
    import hashlib
    h = hashlib.sha256()
    root = _root()
    for top in ("impl", "harness", "scenarios"):
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


def _root() -> str:
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pyproject_version() -> Optional[str]:
    try:
        with open(os.path.join(_root(), "pyproject.toml"), encoding="utf-8") as f:
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
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=5, cwd=_root())
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def _nvidia_driver() -> Optional[str]:
    return _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])


def _git_commit() -> Optional[str]:
    if not os.path.exists(os.path.join(_root(), ".git")):
        return None
    return _run(["git", "rev-parse", "HEAD"])
