"""A release's wheel: downloaded once and kept, and -- for a server whose wheel is mostly
compiled GPU code -- only its Python files unpacked (``targets.envs`` builds release
environments with these)."""
from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import List

from seams.paths import REPO_ROOT

DOWNLOADS = os.path.join(REPO_ROOT, ".releases", ".downloads")  # release wheels, kept
STAGING = ".staging-"  # a download in progress: never a wheel
PIP_TAIL_LINES = 3  # what a failed pip step shows of its own output


class EnvError(ValueError):
    """A release that cannot be set up or is not set up: bad input."""


def run_step(cmd: List[str]) -> None:
    """A set-up step; its own output only when it fails (its last lines, in the error)."""
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [ln for ln in (proc.stderr or proc.stdout).splitlines() if ln.strip()]
        raise EnvError(f"set-up step failed ({proc.returncode}): "
                       f"{' '.join(map(str, cmd[1:]))[:160]}"
                       + "".join(f"\n  {ln[:200]}" for ln in tail[-PIP_TAIL_LINES:]))


def download(package: str, version: str) -> str:
    """The release's wheel, downloaded once into ``DOWNLOADS`` and reused by every later
    set-up of it (a re-run of ``make upstream``, a lock, CI's second build)."""
    folder = os.path.join(DOWNLOADS, package)
    os.makedirs(folder, exist_ok=True)
    mine = [w for w in glob.glob(os.path.join(folder, f"{package}-{version}-*.whl"))]
    if not mine:
        # into a staging folder first: an interrupted download never looks like a wheel
        with tempfile.TemporaryDirectory(prefix=STAGING, dir=folder) as tmp:
            run_step([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                  "--only-binary=:all:", "-d", tmp, f"{package}=={version}"])
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(folder, name))
        mine = glob.glob(os.path.join(folder, f"{package}-{version}-*.whl"))
    if not mine:
        raise EnvError(f"pip downloaded no {package} {version} wheel")
    return mine[0]


def unpack_python(wheel: str, site: str) -> int:
    """The wheel's ``.py`` files and its ``.dist-info`` (its version, requirements and
    RECORD -- the hashes the contract compares executed files with) into ``site``;
    returns how many files. Members are checked to stay inside ``site``."""
    count = 0
    root = os.path.realpath(site)
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            name = info.filename
            top = name.split("/", 1)[0]
            if info.is_dir() or not (name.endswith(".py") or top.endswith(".dist-info")):
                continue
            dest = os.path.realpath(os.path.join(site, name))
            if not dest.startswith(root + os.sep):
                raise EnvError(f"the wheel has a member outside its folder: {name[:120]!r}")
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with z.open(info) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out)
            count += 1
    return count


