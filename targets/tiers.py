"""What every target's contract shares beyond reading source: the installed version, the
supported range, the files a verdict covers and the tier they give (``targets.static``
reads the source)."""
from __future__ import annotations

import importlib.metadata
import os
from typing import Dict, List, Optional, Tuple

from packaging.version import InvalidVersion, Version

from targets.static import module_path


class MetadataError(LookupError):
    """The package is installed, but its metadata names no readable version."""


def installed_version(package: str) -> str:
    """The installed ``package``'s version, from its metadata (nothing imported);
    ``LookupError`` when it is not installed (``MetadataError`` when it is, without a
    version its metadata names)."""
    try:
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise LookupError(f"{package} is not installed") from None
    except (OSError, ValueError, UnicodeDecodeError) as exc:  # an unreadable dist-info
        raise MetadataError(f"{package}'s metadata cannot be read "
                          f"({type(exc).__name__})") from None
    # a dist-info without its METADATA file (or one without a Version field) reads as
    # None: no version to check, so nothing to run -- never a TypeError further on
    if not isinstance(version, str) or not version.strip():
        raise MetadataError(f"{package}'s metadata names no version (its .dist-info has no "
                          f"METADATA file, or no Version field in it)")
    return version


def version_problems(package: str, version: str, supported) -> List[str]:
    """Why ``version`` of ``package`` is not in ``supported`` (a ``SpecifierSet``)."""
    try:
        v = Version(version)
    except InvalidVersion:
        return [f"{package}'s version {version[:80]!r} is not a version number"]
    if v not in supported:
        return [f"{package} {version} is outside the supported range {supported}"]
    return []


def same_version(a: object, b: object) -> bool:
    """Do two spellings name one release (``0.17.00``, ``v0.17.0`` and ``0.17.0`` do)?
    Compared as parsed versions, never as text; one that does not parse is the same only
    as itself."""
    if not isinstance(a, str) or not isinstance(b, str):
        return False
    try:
        return Version(a) == Version(b)
    except InvalidVersion:
        return a == b


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


def installed_hashes(root: str) -> Optional[Dict[str, str]]:
    """The wheel's own record of the files it installed (``*.dist-info/RECORD``): the
    file's path (relative to site-packages) -> its sha256 as RECORD writes it. None where
    there is no record (a source checkout)."""
    import csv
    import glob
    site = os.path.dirname(root)
    package = os.path.basename(root)
    records = glob.glob(os.path.join(site, f"{package}-*.dist-info", "RECORD"))
    if len(records) != 1:
        return None
    out: Dict[str, str] = {}
    try:
        with open(records[0], newline="", encoding="utf-8") as f:
            for row in csv.reader(f):
                if len(row) >= 2 and row[1].startswith("sha256="):
                    out[os.path.normpath(row[0])] = row[1][len("sha256="):]
    except (OSError, ValueError, csv.Error):
        return None
    return out


def changed_files(root: str, paths) -> List[str]:
    """Of ``paths`` (files under ``root``), those whose content is not what the installed
    wheel recorded (edited, or not the wheel's at all), relative to ``root``'s parent;
    [] where there is no record to compare with."""
    import base64
    import hashlib
    recorded = installed_hashes(root)
    if recorded is None:
        return []
    site = os.path.dirname(root)
    changed = []
    for path in sorted(set(paths)):
        rel = os.path.normpath(os.path.relpath(path, site))
        try:
            with open(path, "rb") as f:
                digest = base64.urlsafe_b64encode(hashlib.sha256(f.read()).digest())
        except OSError:
            changed.append(rel)
            continue
        if recorded.get(rel) != digest.rstrip(b"=").decode():
            changed.append(rel)
    return changed


def files_digest(root: str, modules: List[str]) -> str:
    """sha256 over the named modules' files (name and content), 16 hex digits."""
    import hashlib
    h = hashlib.sha256()
    for name in sorted(modules):
        try:
            with open(module_path(root, name), "rb") as f:
                data = f.read()
        except OSError:
            data = b"<missing>"
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()[:16]
