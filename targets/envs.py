"""One environment per release of an upstream server: ``make upstream SGLANG=0.5.17``.

Each release pins its own versions of what its driven modules import (``transformers``,
``xgrammar``, ``tokenizers``, ...; a newer ``transformers`` breaks older sglang imports),
so each gets a venv of its own under ``.releases/PACKAGE/VERSION``. The venv sees the core
environment (torch, hypothesis, specrace itself) through a ``.pth`` line that adds the
core venv's site-packages *after* its own, so the release's pins shadow the core's.
In it: the package itself and the pure-Python set its driven modules import (the
target's requirements file), with ``--no-deps`` (the server's metadata also pins torch
and CUDA-only wheels, which the code under test never calls). Then every requirement of
the release's wheel that a package the venv sees does not meet (the core's newer
``transformers``, say) goes in as the release states it, with pip's resolver for its
dependencies, until none is unmet; set-up fails if one stays unmet. Two exceptions:
``torch`` stays the core's CPU build, and ``xgrammar`` goes in without its dependencies,
as in the core set-up (its ``triton`` is ~1 GB, for CUDA only). A requirement nothing
provides is left out: the driven modules never import most of what a server lists.
Those installs resolve within the target's ``locks/VERSION.txt`` where it exists: the
versions the venv last passed the release gate with.

A venv is built in a staging folder beside the others and renamed into place only once
it is whole: a set-up that fails leaves the release's previous environment (if any)
ready and untouched, and no half-built folder behind. Only folders named as a version
in the supported range are environments; ``skipped`` says why each other folder is not.

Why venv + pip and not nox or uv: uv does not take the machine's local torch file (it
would fetch a CUDA build of several GB), and nox would add a dependency to run these
same pip commands.

    python -m targets.envs sglang setup VERSION   # what `make upstream SGLANG=V` runs
    python -m targets.envs sglang lock VERSION    # re-pin its lock (`make lock`)
    python -m targets.envs sglang list            # the release environments set up
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import sysconfig
import zipfile
from dataclasses import dataclass
from typing import List, Optional, Tuple

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

import targets
from harness.target import Environments
from seams import children, signals
from seams.paths import REPO_ROOT
from targets import wheels
from targets.wheels import EnvError, download, staging, sweep, unpack_python
from targets.wheels import run_step as _run

ENVS = os.path.join(REPO_ROOT, ".releases")
READY = ".specrace-ready"
STAGING = ".staging-"  # a venv being built: never an environment
# Installed without their dependencies, as in the core set-up: xgrammar's triton is ~1 GB,
# for CUDA only.
NO_DEPS = ("xgrammar",)
# Left as the core has them whatever the release asks: torch is the core's pinned CPU
# build (a release pins a CUDA build of several GB that the code under test never needs).
KEEP_CORE = ("torch",)


@dataclass(frozen=True)
class ReleaseLine:
    """The releases of one upstream package, each in an environment of its own."""
    package: str  # the distribution and import name: "sglang"
    supported: SpecifierSet
    requirements: str  # the pure-Python set its driven modules import (one file)
    locks: str  # the folder of VERSION.txt locks
    make_var: str  # the make variable that names a release: SGLANG
    # Install only the wheel's Python files and its metadata (vLLM: a 433 MB wheel, ~11 MB
    # of it ``.py``; the compiled rest is CUDA code the driven modules never load)
    python_only: bool = False

    @property
    def folder(self) -> str:
        return os.path.join(ENVS, self.package)

    def hint(self, version: str = "VERSION") -> str:
        return f"make upstream TARGET={self.package} {self.make_var}={version}"

    def check_release(self, version: str) -> str:
        try:
            v = Version(version)
        except InvalidVersion:
            raise EnvError(f"{version[:80]!r} is not a version number") from None
        if v not in self.supported:
            raise EnvError(f"{self.package} {version} is outside the supported range "
                           f"{self.supported}")
        return str(v)

    def env_dir(self, version: str) -> str:
        return os.path.join(self.folder, version)

    def env_python(self, version: str) -> str:
        return os.path.join(self.env_dir(version), "bin", "python")

    def release_root(self, version: str) -> Optional[str]:
        """The installed package of ``version``'s environment (None: not there)."""
        found = glob.glob(os.path.join(self.env_dir(version), "lib", "python*",
                                       "site-packages", self.package))
        return found[0] if found else None

    def _survey(self) -> Tuple[List[str], List[Tuple[str, str]]]:
        """(the ready releases, oldest first; every other folder with why it is not one)."""
        ready, skipped = [], []
        if not os.path.isdir(self.folder):
            return [], []
        for name in sorted(os.listdir(self.folder)):
            path = os.path.join(self.folder, name)
            if name.startswith(STAGING) or not os.path.isdir(path):
                continue
            try:
                canonical = self.check_release(name)
            except EnvError as exc:
                skipped.append((name, str(exc)))
                continue
            if canonical != name:
                skipped.append((name, f"not named as a release (the name is {canonical})"))
            elif not os.path.exists(os.path.join(path, READY)):
                skipped.append((name, "its set-up never finished"))
            elif not os.access(self.env_python(name), os.X_OK):
                skipped.append((name, "it has no interpreter"))
            else:
                ready.append(name)
        return sorted(ready, key=Version), skipped

    def installed(self) -> List[str]:
        """Releases with a finished environment, oldest first."""
        return self._survey()[0]

    def skipped(self) -> List[Tuple[str, str]]:
        """Folders under ``folder`` that are not a release environment, with why."""
        return self._survey()[1]

    def require(self, version: str) -> str:
        version = self.check_release(version)
        if version not in self.installed():
            raise EnvError(f"{self.package} {version} is not set up here; run "
                           f"`{self.hint(version)}`")
        return self.env_python(version)

    def chosen(self, releases: Optional[List[str]]) -> List[str]:
        """The releases a command asked for (all set up, when none), each checked."""
        versions = ([self.check_release(v) for v in releases] if releases
                    else self.installed())
        for v in versions:
            self.require(v)
        if not versions:
            raise EnvError(f"no {self.package} release is set up; run `{self.hint()}`")
        return versions

    def lock_path(self, version: str) -> str:
        """The versions a release's venv last passed the release gate with: constraints
        on what its set-up resolves (a newer dependency cannot reach CI unseen)."""
        return os.path.join(self.locks, f"{version}.txt")

    def lock(self, version: str) -> None:
        """Write ``lock_path(version)``: what the release's venv holds of its own (the
        core's packages are the core lock's), the package itself aside (from its wheel)."""
        python = self.require(version)
        out = subprocess.run(children.command(sys.executable, "-m", "pip", "freeze", "--path",
                                              _site(python)), env=children.env(project=False),
                             capture_output=True, text=True, check=True).stdout
        pins = [line for line in out.splitlines() if "==" in line
                and canonicalize_name(line.split("==")[0]) != self.package]
        os.makedirs(self.locks, exist_ok=True)
        with open(self.lock_path(version), "w") as f:
            f.write(f"# {self.package} {version}'s venv as it last passed the release gate "
                    "(targets/envs.py: lock)\n" + "".join(p + "\n" for p in pins))
        print(f"{self.package} {version}: {self.lock_path(version)} ({len(pins)} pins)")

    def setup(self, version: str) -> None:
        """Build ``version``'s environment in a staging folder, then swap it in. The
        staging folder goes on any way out, SIGINT and SIGTERM included, and what a killed
        set-up left (no live set-up holds it: ``wheels.sweep``) goes first."""
        version = self.check_release(version)
        for name in sweep(self.folder):
            print(f"{self.package}: removed {name}, left by a set-up that did not finish",
                  flush=True)
        with staging(self.folder, f"{version}-") as d:
            placed = self._build(version, d)
            open(os.path.join(d, READY), "w").close()
            _swap_in(d, self.env_dir(version))
        print(f"{self.package} {version}: {self.env_dir(version)} "
              f"(its own {', '.join(str(r) for r in placed) or 'nothing'})")

    def _build(self, version: str, d: str) -> List[Requirement]:
        python = os.path.join(d, "bin", "python")
        _run([sys.executable, "-m", "venv", "--without-pip", "--clear", d])
        with open(os.path.join(_site(python), "specrace-core.pth"), "w") as f:
            # processed at start-up: the core venv's site-packages (and its .pth files,
            # so the editable specrace install) after the release's own
            f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
        wheel = download(self.package, version)
        rest = [line.strip() for line in open(self.requirements)
                if line.strip() and not line.startswith("#")
                and canonicalize_name(Requirement(line.strip()).name) != self.package]
        if self.python_only:
            unpack_python(wheel, _site(python))
            if rest:
                _pip(python, "--no-deps", *rest)
        else:
            _pip(python, "--no-deps", wheel, *rest)
        locked = self.lock_path(version)
        return _meet(python, release_requirements(wheel),
                     locked if os.path.exists(locked) else None)


class LineEnvironments(Environments):
    """A target's environments, one per release of its ``ReleaseLine`` (``line``: each
    target's subclass names its own)."""

    line: ReleaseLine

    def chosen(self, asked: List[str]) -> List[str]:
        return self.line.chosen(asked)

    def python(self, version: str) -> str:
        return self.line.env_python(version)

    def skipped(self) -> List[Tuple[str, str]]:
        return self.line.skipped()


def _swap_in(staging: str, final: str) -> None:
    """Rename the finished ``staging`` venv to ``final``; a previous one is moved aside
    first and removed only once the new one is in place (a reader never finds the
    release without an environment for longer than two renames)."""
    if not os.path.exists(final):
        os.rename(staging, final)
        return
    # the previous one's place is held like a staging folder (wheels.staging): a sweep
    # by another set-up never takes it while it may still have to go back
    with wheels.staging(os.path.dirname(final), "old-") as old:
        with signals.deferred():  # two renames, never one: a signal waits for both
            os.rename(final, old)  # onto the empty folder held for it
            try:
                os.rename(staging, final)
            except OSError:
                os.rename(old, final)  # put the previous one back
                raise


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
    (the driven modules never import most of what a server lists), nor KEEP_CORE."""
    names = [r.name for r in reqs if canonicalize_name(r.name) not in KEEP_CORE]
    out = subprocess.run(children.command(python, "-c", _VISIBLE, *names),
                         env=children.env(project=False), capture_output=True, text=True,
                         check=True).stdout
    seen = json.loads(out)
    return [(r, seen[r.name]) for r in reqs if seen.get(r.name) is not None
            and not r.specifier.contains(seen[r.name], prereleases=True)]


def _site(python: str) -> str:
    return subprocess.run(children.command(python, "-c", "import sysconfig; "
                                           "print(sysconfig.get_paths()['purelib'])"),
                          env=children.env(project=False), capture_output=True, text=True,
                          check=True).stdout.strip()


def _pip(python: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *args]
    print("+ " + " ".join(cmd[3:]), flush=True)
    _run(cmd)


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


def main(argv: Optional[List[str]] = None) -> int:
    """The set-up command: SIGINT / SIGTERM end it with one line and 130 / 143, its
    staging folder and its running step (pip's whole process group) gone first."""
    signals.install()
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt as exc:
        name = exc.signame if isinstance(exc, signals.Interrupted) else "SIGINT"
        print(f"specrace: set-up interrupted ({name}); nothing of it is left",
              file=sys.stderr)
        return signals.status_of(exc)


def _main(argv: List[str]) -> int:
    usage = "usage: python -m targets.envs TARGET setup VERSION | lock VERSION | list"
    try:
        if not argv:
            raise EnvError(usage)
        environments = targets.declared(argv[0]).environments()
        if environments is None:
            raise EnvError(f"the {argv[0]} target has no release environments")
        line = environments.line
        if argv[1:2] == ["setup"] and len(argv) == 3:
            line.setup(argv[2])
        elif argv[1:2] == ["lock"] and len(argv) == 3:
            line.lock(argv[2])
        elif argv[1:] == ["list"]:
            print("\n".join(line.installed()))
            for name, why in line.skipped():
                print(f"specrace: skipping {os.path.join(line.folder, name)}: {why}",
                      file=sys.stderr)
        else:
            raise EnvError(usage)
    except (EnvError, targets.TargetError) as exc:
        print(f"specrace: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
