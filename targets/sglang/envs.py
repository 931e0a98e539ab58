"""One environment per sglang release: ``make upstream SGLANG=0.5.17``.

Each release pins its own versions of what its driven modules import (``transformers``,
``xgrammar``, ``tokenizers``, ...; a newer ``transformers`` breaks older sglang imports),
so each gets a venv of its own under ``.releases/VERSION``. The venv sees the core
environment (torch, hypothesis, specrace itself) through a ``.pth`` line that adds the
core venv's site-packages *after* its own, so the release's pins shadow the core's.
In it, with pip's resolver: the release's own ``==`` pins, read from its wheel's
metadata, for the packages in ``PINNED`` (their dependencies resolved against what is
already there), then sglang itself and the pure-Python set of
``requirements-upstream.txt`` with ``--no-deps`` (sglang's metadata also pins torch and
the CUDA-only wheels, which the code under test never calls). ``xgrammar`` goes in
without its dependencies, as in the core set-up (its ``triton`` is ~1 GB, for CUDA only).

Why venv + pip and not nox or uv: uv does not take the machine's local torch file (it
would fetch a CUDA build of several GB), and nox would add a dependency to run these
same pip commands.

    python -m targets.sglang.envs setup VERSION     # what `make upstream SGLANG=V` runs
    python -m targets.sglang.envs list              # the installed release environments
"""
from __future__ import annotations

import glob
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from typing import Dict, List, Optional

from packaging.version import InvalidVersion, Version

from .contract import SUPPORTED

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENVS = os.path.join(ROOT, ".releases")
# What the driven modules import whose version the release pins.
PINNED = ("transformers", "tokenizers", "huggingface-hub", "xgrammar", "apache-tvm-ffi")
NO_DEPS = ("xgrammar",)


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


def wheel_pins(wheel: str) -> Dict[str, str]:
    """``name -> version`` for the ``==`` pins (no extras, no markers) of PINNED."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    pins = {}
    for line in text.splitlines():
        m = re.match(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*==\s*([^\s;,]+)\s*$", line)
        if m and m.group(1).lower().replace("_", "-") in PINNED:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _pip(python: str, *args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--python", python, "install", "-q", *args]
    print("+ " + " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)


def setup(version: str) -> None:
    version = check_release(version)
    d = env_dir(version)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", d], check=True)
    site = subprocess.run([env_python(version), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(site, "specrace-core.pth"), "w") as f:
        # processed at start-up: the core venv's site-packages (and its .pth files, so
        # the editable specrace install) after the release's own
        f.write(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        "--only-binary=:all:", "-d", tmp, f"sglang=={version}"], check=True)
        wheel = glob.glob(os.path.join(tmp, "sglang-*.whl"))[0]
        pins = wheel_pins(wheel)
        resolved = [f"{k}=={v}" for k, v in pins.items() if k not in NO_DEPS]
        if resolved:
            _pip(env_python(version), *resolved)
        plain = [f"{k}=={v}" for k, v in pins.items() if k in NO_DEPS]
        if plain:
            _pip(env_python(version), "--no-deps", *plain)
        reqs = os.path.join(ROOT, "requirements-upstream.txt")
        rest = [line.strip() for line in open(reqs)
                if line.strip() and not line.startswith("#")
                and not line.startswith("sglang")]
        _pip(env_python(version), "--no-deps", wheel, *rest)
    open(os.path.join(d, ".specrace-ready"), "w").close()
    print(f"sglang {version}: {d} ({', '.join(f'{k} {v}' for k, v in pins.items())})")


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["setup"] and len(argv) == 2:
            setup(argv[1])
        elif argv == ["list"]:
            print("\n".join(installed()))
        else:
            raise EnvError("usage: python -m targets.sglang.envs setup VERSION | list")
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
