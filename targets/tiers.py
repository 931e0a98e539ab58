"""What every target's contract shares beyond reading source: the installed version, the
supported range, the files a verdict covers and the tier they give (``targets.static``
reads the source)."""
from __future__ import annotations

import importlib.metadata
import os
from typing import Dict, List, Tuple

from packaging.version import InvalidVersion, Version

from targets.static import changed_files, files_digest, module_path


def installed_version(package: str) -> str:
    """The installed ``package``'s version, from its metadata (nothing imported);
    ``LookupError`` when it is not installed."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(f"{package} is not installed") from None


def version_problems(package: str, version: str, supported) -> List[str]:
    """Why ``version`` of ``package`` is not in ``supported`` (a ``SpecifierSet``)."""
    try:
        v = Version(version)
    except InvalidVersion:
        return [f"{package}'s version {version[:80]!r} is not a version number"]
    if v not in supported:
        return [f"{package} {version} is outside the supported range {supported}"]
    return []


def release_tier(version: str, problems: List[str], digest: str, changed: List[str],
                 verified: Dict[str, str]) -> str:
    """A contract's tier: *unsupported* with any problem; *verified* when the release and
    the digest of its driven files are the ones measured (``verified``) and none of its
    files differs from the wheel's; else *compatible*."""
    if problems:
        return "unsupported"
    return "verified" if verified.get(version) == digest and not changed else "compatible"


def driven_files(root: str, modules: List[str]) -> Tuple[str, List[str]]:
    """(the digest of ``modules``' files, those of them that are not the wheel's)."""
    present = [module_path(root, m) for m in modules if os.path.exists(module_path(root, m))]
    return files_digest(root, modules), changed_files(root, present)
