"""One environment per sglang release: ``make upstream SGLANG=0.5.17``.

Each release pins its own versions of what its driven modules import (``transformers``,
``xgrammar``, ``tokenizers``, ...; a newer ``transformers`` breaks older sglang imports),
so each gets a venv of its own under ``.releases/VERSION``. The venv sees the core
environment (torch, hypothesis, specrace itself) through a ``.pth`` line that adds the
core venv's site-packages *after* its own, so the release's pins shadow the core's.
In it: sglang itself and the pure-Python set of ``requirements-upstream.txt``, with
``--no-deps`` (sglang's metadata also pins torch and the CUDA-only wheels, which the code
under test never calls). Then every requirement of the release's wheel that a package
the venv sees does not meet (the core's newer ``transformers``, or the ``kernels`` that
the core's ``transformers`` pulls in and 0.5.17's cannot load) goes in as the release
states it, with pip's resolver for its dependencies, until none is unmet; set-up fails
if one stays unmet. Two exceptions: ``torch`` stays the core's CPU build, and ``xgrammar``
goes in without its dependencies, as in the core set-up (its ``triton`` is ~1 GB, for
CUDA only). A requirement nothing provides is left out: the driven modules never import
most of what sglang lists, and the bootstrap stands in for the GPU-only ones. Those
installs resolve within ``locks/VERSION.txt`` where it exists: the versions the venv last
passed the release gate with (``kernels`` 0.14.1 brings an unpinned ``kernels-data``).

Why venv + pip and not nox or uv: uv does not take the machine's local torch file (it
would fetch a CUDA build of several GB), and nox would add a dependency to run these
same pip commands.

    python -m targets.sglang.environments.envs setup VERSION     # what `make upstream SGLANG=V` runs
    python -m targets.sglang.environments.envs lock VERSION      # re-pin locks/VERSION.txt (`make lock`)
    python -m targets.sglang.environments.envs list              # the installed release environments
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from typing import List, Optional, Tuple

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from seams.paths import REPO_ROOT
from targets.sglang.boundary.contract import SUPPORTED

ROOT = REPO_ROOT
ENVS = os.path.join(ROOT, ".releases")
LOCKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "locks")
# Installed without their dependencies, as in the core set-up: xgrammar's triton is ~1 GB,
# for CUDA only.
NO_DEPS = ("xgrammar",)
# Left as the core has them whatever the release asks: torch is the core's pinned CPU
# build (a release pins a CUDA build of several GB that the code under test never needs).
KEEP_CORE = ("torch",)


class EnvError(ValueError):
    """A release that cannot be set up or is not set up: bad input."""


def check_release(version: str) -> str:
    try:
        v = Version(version)
    except InvalidVersion:
        raise EnvError(f"{version[:80]!r} is not a version number") from None
    if v not in SUPPORTED:
        raise EnvError(f"sglang {version} is outside the supported range {SUPPORTED}")
    return str(v)


def env_dir(version: str) -> str:
    return os.path.join(ENVS, version)


def env_python(version: str) -> str:
    return os.path.join(env_dir(version), "bin", "python")


def installed() -> List[str]:
    """Releases with a finished environment, oldest first."""
    out = []
    for marker in glob.glob(os.path.join(ENVS, "*", ".specrace-ready")):
        name = os.path.basename(os.path.dirname(marker))
        try:
            out.append((Version(name), name))
        except InvalidVersion:
            continue
    return [name for _, name in sorted(out)]


def require(version: str) -> str:
    version = check_release(version)
    if version not in installed():
        raise EnvError(f"sglang {version} is not set up here; run `make upstream "
                       f"SGLANG={version}`")
    return env_python(version)


def chosen(releases: Optional[List[str]]) -> List[str]:
    """The releases a command asked for (all set up, when none), each checked."""
    versions = [check_release(v) for v in releases] if releases else installed()
    for v in versions:
        require(v)
    if not versions:
        raise EnvError("no sglang release is set up; run `make upstream SGLANG=VERSION`")
    return versions


def release_requirements(wheel: str) -> List[Requirement]:
    """What the release's wheel requires on this machine (markers evaluated, no extras)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    reqs = []
    for line in text.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                reqs.append(req)
    return reqs


# Run by the release's interpreter: the version of each named distribution it would load
# (its own site-packages first, then the core's), or None.
_VISIBLE = ("import importlib.metadata as m, json, sys\n"
            "def v(n):\n"
            "    try: return m.version(n)\n"
            "    except m.PackageNotFoundError: return None\n"
            "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")


def unmet(python: str, reqs: List[Requirement]) -> List[Tuple[Requirement, str]]:
    """The release's requirements that a package its interpreter sees fails: the core's
    newer ``kernels`` under 0.5.17's ``transformers``, say. Missing ones are not unmet
    (the driven modules never import most of what sglang lists), nor KEEP_CORE."""
    names = [r.name for r in reqs if canonicalize_name(r.name) not in KEEP_CORE]
    out = subprocess.run([python, "-c", _VISIBLE, *names], capture_output=True, text=True,
                         check=True).stdout
    seen = json.loads(out)
    return [(r, seen[r.name]) for r in reqs if seen.get(r.name) is not None
            and not r.specifier.contains(seen[r.name], prereleases=True)]


def lock_path(version: str) -> str:
    """The versions a release's venv last passed the release gate with: constraints on
    what its set-up resolves (a newer dependency of a release's ``kernels`` or
    ``transformers`` cannot reach CI unseen). ``python -m targets.sglang.environments.envs lock V``
    (``make lock``) writes it from the venv."""
    return os.path.join(LOCKS, f"{version}.txt")


def _site(python: str) -> str:
    return subprocess.run([python, "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()


def lock(version: str) -> None:
    """Write ``lock_path(version)``: what the release's venv holds of its own (the core's
    packages are the core lock's), sglang itself aside (installed from its wheel)."""
    python = require(version)
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--path", _site(python)],
                         capture_output=True, text=True, check=True).stdout
    pins = [line for line in out.splitlines() if "==" in line
            and canonicalize_name(line.split("==")[0]) != "sglang"]
    os.makedirs(LOCKS, exist_ok=True)
    with open(lock_path(version), "w") as f:
        f.write(f"# sglang {version}'s venv as it last passed the release gate "
                "(targets/sglang/environments/envs.py: lock)\n" + "".join(p + "\n" for p in pins))
    print(f"sglang {version}: {lock_path(version)} ({len(pins)} pins)")


def _pip(python: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *args]
    print("+ " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)


def _meet(python: str, reqs: List[Requirement],
          constraints: Optional[str] = None) -> List[Requirement]:
    """Install the release's own requirement for each one unmet, until none is; returns
    what was installed. pip's resolver places their dependencies (NO_DEPS aside), within
    ``constraints`` (a lock file) when given."""
    locked = ("-c", constraints) if constraints else ()
    placed: List[Requirement] = []
    for _ in range(3):  # an install can unmeet another requirement; it settles in one
        gaps = [r for r, _ in unmet(python, reqs)]
        if not gaps:
            return placed
        resolved = [str(r) for r in gaps if canonicalize_name(r.name) not in NO_DEPS]
        plain = [str(r) for r in gaps if canonicalize_name(r.name) in NO_DEPS]
        if resolved:
            _pip(python, *locked, *resolved)
        if plain:
            _pip(python, *locked, "--no-deps", *plain)
        placed += [r for r in gaps if r not in placed]  # each once, if a round redoes it
    left = ", ".join(f"{r.name} {have} (wants {r.specifier})" for r, have in unmet(python, reqs))
    raise EnvError(f"the release's requirements stay unmet after 3 installs: {left}")


def setup(version: str) -> None:
    version = check_release(version)
    d = env_dir(version)
    python = env_python(version)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", d], check=True)
    with open(os.path.join(_site(python), "specrace-core.pth"), "w") as f:
        # processed at start-up: the core venv's site-packages (and its .pth files, so
        # the editable specrace install) after the release's own
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, f"sglang=={version}"], check=True)
        wheel = glob.glob(os.path.join(tmp, "sglang-*.whl"))[0]
        reqs = os.path.join(ROOT, "requirements-upstream.txt")
        rest = [line.strip() for line in open(reqs)
                if line.strip() and not line.startswith("#")
                and not line.startswith("sglang")]
        _pip(python, "--no-deps", wheel, *rest)
        locked = lock_path(version)
        placed = _meet(python, release_requirements(wheel),
                       locked if os.path.exists(locked) else None)
    open(os.path.join(d, ".specrace-ready"), "w").close()
    print(f"sglang {version}: {d} (its own {', '.join(str(r) for r in placed) or 'nothing'})")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["setup"] and len(argv) == 2:
            setup(argv[1])
        elif argv[:1] == ["lock"] and len(argv) == 2:
            lock(argv[1])
        elif argv == ["list"]:
            print("\n".join(installed()))
        else:
            raise EnvError("usage: python -m targets.sglang.environments.envs setup VERSION | lock VERSION"
                           " | list")
    except EnvError as exc:
        print(f"specrace: error: {exc}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as exc:
        print(f"specrace: error: set-up step failed ({exc.returncode}): "
              f"{' '.join(map(str, exc.cmd))[:200]}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
