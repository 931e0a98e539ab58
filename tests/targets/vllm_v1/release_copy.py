"""A release's source files copied into a test's own folder, to be edited there: the
contract tests change what a target relies on in the copy and read the verdict, never
touching the release itself."""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Iterable

from targets import static


def copy_modules(root: str, modules: Iterable[str], dst_root: Path) -> Path:
    """Each of ``modules`` (dotted names) that the release at ``root`` has, copied to the
    same place under ``dst_root`` (the modules it lacks are left out: a later release's
    names, read where they exist). Returns ``dst_root``."""
    for module in modules:
        src = static.module_path(root, module)
        if os.path.exists(src):
            dst = static.module_path(str(dst_root), module)
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            shutil.copy(src, dst)
    return dst_root


def edit(root: Path, module: str, old: str, new: str, count: int = 1) -> None:
    """``old`` replaced by ``new`` in the copy of ``module`` under ``root``; ``old`` must
    stand there ``count`` times (an edit that misses its text fails, not passes)."""
    path = static.module_path(str(root), module)
    text = open(path).read()
    assert text.count(old) == count, old
    open(path, "w").write(text.replace(old, new))
