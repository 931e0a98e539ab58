"""What an offline GPU machine needs to run a server target, built here from the repo's
locks and carried with the device tool's ``carry`` (64 MiB a call, the tree included):

    python tools/gpu/bundle.py sglang 0.5.23 [OUT]   # make gpu-bundle-sglang SGLANG=0.5.23
    python tools/gpu/bundle.py vllm 0.17.0 [OUT]     # make gpu-bundle-vllm VLLM=0.17.0

OUT (default ``.sgbundle`` / ``.vllmgpu``, git-ignored) gets ``site.tar.xz`` -- one
site-packages tree for CPython 3.12 on x86_64 Linux (the GPU image's Python), xz'd (xz over
the installed files is ~40 % smaller than the wheels) -- and ``MANIFEST.json`` (each
package, its version and which lock pinned it). On the GPU: ``mkdir -p /tmp/site && tar
xJf OUT/site.tar.xz -C /tmp/site && export PYTHONPATH=/tmp/site:.`` (sglang;
``tools/gpu/h200_lib.sh`` does it) or ``source tools/gpu/vllm_gpu_env.sh OUT`` (vLLM).

What goes in: the release's environment as ``make upstream`` builds it -- the core lock
(``requirements.lock``), overlaid by the target's requirements file, overlaid by the
release's own lock (``targets/TARGET/environments/locks/VERSION.txt``) -- less what the
GPU image already holds (``tools/gpu/image.txt``); an image package goes in only where the
release's lock pins a version the image is not known to have (sglang 0.5.23's
transformers 5.19.0 over the image's 5.17.0). Every version comes from a lock: a package
no lock pins is an error, never "whatever resolves today" (an unpinned ``openai`` once
resolved to 3.63.0, which imports ``httpx2``, in no bundle). ``UNUSED`` lists what is left
out on purpose, each with why. The server itself: sglang's wheel as released; vLLM's
wheel's Python files only (``targets.wheels.unpack_python``, as its release environment
has them: the compiled rest is CUDA code the driven path never loads).

The bundle is built beside OUT and swapped in whole, so a failed build leaves the
previous one in place. ``tools/gpu/check_bundle.py`` checks a bundle on the CPU: unpacked
into an empty folder, the driven path imports with nothing else beside the image's set.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from packaging.utils import canonicalize_name  # noqa: E402
from packaging.version import InvalidVersion, Version  # noqa: E402

IMAGE = os.path.join(ROOT, "tools", "gpu", "image.txt")
CORE_LOCK = os.path.join(ROOT, "requirements.lock")
# Each call carries the tree and one bundle: at most 64 MiB together.
CARRY_LIMIT = 64 << 20
PYTHON_TAG = "3.12"
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64",
             "manylinux1_x86_64", "manylinux_2_5_x86_64")


class BundleError(Exception):
    """A bundle that cannot be built as asked: one line for the user."""


TARGETS = {
    "sglang": {
        "requirements": os.path.join(ROOT, "requirements-upstream.txt"),
        "locks": os.path.join(ROOT, "targets", "sglang", "environments", "locks"),
        "out": ".sgbundle", "make_var": "SGLANG",
        # the core lock's tools of this machine, not of a trial (a run never imports them)
        "unused": {
            "truststore": "pip's TLS helper on this machine",
            "tomlkit": "`make lock`'s TOML writer",
            "httpx2": "huggingface_hub 2's client; the image's hub 1.33 uses httpx",
            "httpcore2": "httpx2's transport",
            "kernels": "transformers' hub kernels, fetched from the network at run time "
                       "(the GPU machines are offline)",
            "kernels-data": "kernels' data",
        },
    },
    "vllm": {
        "requirements": os.path.join(ROOT, "requirements-vllm.txt"),
        "locks": os.path.join(ROOT, "targets", "vllm", "environments", "locks"),
        "out": ".vllmgpu", "make_var": "VLLM",
        "unused": {
            "truststore": "pip's TLS helper on this machine",
            "tomlkit": "`make lock`'s TOML writer",
            "httpx2": "huggingface_hub 2's client; the release pins hub 0.36 (httpx)",
            "httpcore2": "httpx2's transport",
            "kernels": "transformers 5's hub kernels; the release pins transformers 4",
            "kernels-data": "kernels' data",
            "opencv-python-headless": "multimodal inputs (170 MiB installed; a trial never "
                                      "imports cv2)",
        },
        # the release pins its own, but the core lock's serves: vLLM imports xgrammar only
        # for its structured-output backend, which no trial drives (the toy grammar is
        # specrace's), and specrace's impl target imports the core's; 0.17.0's 0.1.29 is
        # 82 MiB installed, over a call's carry with the rest
        "core_over_release": {"xgrammar": "vLLM's xgrammar backend is not driven"},
        # the release pins one, the image has one: the image's serves (off the driven path)
        "image_serves": {"uvloop": "the API server's event loop (16 MiB installed)"},
    },
}

_PIN = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)")


def core_pins() -> Dict[str, Tuple[str, str]]:
    """The core environment's pins: ``requirements.lock``, and the Makefile's pins of
    what ``make setup`` installs itself (``XGRAMMAR ?= xgrammar==0.2.9``)."""
    pins = read_pins(CORE_LOCK)
    with open(os.path.join(ROOT, "Makefile")) as f:
        for line in f:
            m = re.match(r"^XGRAMMAR\s*\?=\s*(\S+)", line)
            if m:
                pins.update(read_pins_text(m.group(1)))
    return pins


def read_pins_text(text: str) -> Dict[str, Tuple[str, str]]:
    pins = {}
    for line in text.splitlines():
        m = _PIN.match(line)
        if m:
            pins[canonicalize_name(m.group(1))] = (m.group(1), m.group(2))
    return pins


def read_pins(path: str) -> Dict[str, Tuple[str, str]]:
    """``{canonical name: (name as written, version)}`` of a lock or requirements file's
    ``name==version`` lines (comments and anything unpinned ignored)."""
    with open(path) as f:
        return read_pins_text(f.read())


def image_pins() -> Dict[str, Tuple[str, str, bool]]:
    """The GPU image's set: ``{name: (as written, version, read off the image)}``."""
    out = {}
    with open(IMAGE) as f:
        for line in f:
            m = _PIN.match(line)
            if m:
                out[canonicalize_name(m.group(1))] = (m.group(1), m.group(2),
                                                      "# read" in line)
    return out


def check_version(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        raise BundleError(f"{version[:60]!r} is not a version number") from None


def selection(target: str, version: str) -> Tuple[Dict[str, dict], Dict[str, str]]:
    """(what the bundle holds: ``{name: {"pin": "name==v", "from": lock}}``, what it
    leaves out: ``{name: why}``) for ``target`` ``version``, from the locks alone."""
    spec = TARGETS[target]
    lock = os.path.join(spec["locks"], f"{version}.txt")
    if not os.path.exists(lock):
        have = sorted((f[:-4] for f in os.listdir(spec["locks"]) if f.endswith(".txt")),
                      key=Version)
        raise BundleError(f"{target} {version} has no lock "
                          f"({os.path.relpath(lock, ROOT)}); locked: {' '.join(have)}")
    layers = (("the core lock (requirements.lock, the Makefile's XGRAMMAR)", core_pins()),
              (os.path.relpath(spec["requirements"], ROOT), read_pins(spec["requirements"])),
              (os.path.relpath(lock, ROOT), read_pins(lock)))
    release_lock = layers[2][1]
    keep_core = spec.get("core_over_release", {})
    env: Dict[str, Tuple[str, str, str]] = {}
    for source, pins in layers:  # later layers shadow earlier ones, as in the release venv
        for name, (written, ver) in pins.items():
            env[name] = (written, ver, source)
    for name in keep_core:
        if name in layers[0][1]:
            env[name] = (*layers[0][1][name], layers[0][0])
    env.pop(target, None)  # the server itself is added from its release below
    image = image_pins()
    held, left = {}, {}
    for name, (written, ver, source) in sorted(env.items()):
        if name in spec["unused"]:
            left[name] = spec["unused"][name]
        elif name in spec.get("image_serves", {}) and name in image:
            left[name] = f"the image's ({spec['image_serves'][name]})"
        elif name in image:
            _, have, read = image[name]
            if name in release_lock and not (read and have == ver):
                held[name] = {"pin": f"{written}=={ver}", "from": source,
                              "over_image": f"{have}{'' if read else ' (not read)'}"}
            else:
                left[name] = f"the image's {have}" + ("" if read else " (version not read)")
        else:
            held[name] = {"pin": f"{written}=={ver}", "from": source}
            if name in keep_core and name in release_lock:
                held[name]["over_release"] = (f"{release_lock[name][1]}: "
                                              f"{keep_core[name]}")
    held[target] = {"pin": f"{target}=={version}", "from": "the release"}
    return held, left


def _pip_target(reqs: List[str], dest: str) -> None:
    """``reqs`` installed for CPython 3.12 on x86_64 Linux into ``dest``, no deps."""
    base = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
            "--only-binary=:all:", "--python-version", PYTHON_TAG, "--implementation", "cp",
            "--target", dest, "--upgrade"]
    for p in PLATFORMS:
        base += ["--platform", p]
    r = subprocess.run(base + reqs, capture_output=True, text=True)
    if r.returncode:
        for req in reqs:  # one at a time: the missing wheel names itself
            one = subprocess.run(base + [req], capture_output=True, text=True)
            if one.returncode:
                tail = one.stderr.strip().splitlines()[-1:] or [""]
                raise BundleError(f"no CPython 3.12 x86_64 wheel for {req}: {tail[0][:200]}")
        raise BundleError(f"pip failed: {r.stderr.strip()[-300:]}")


def _pack(site: str, archive: str) -> None:
    """``site`` as an xz'd tar, members sorted and owned by root (same input, same
    archive); no byte code, no console scripts (their shebangs name this machine)."""
    for dirpath, dirnames, _ in os.walk(site):
        for d in list(dirnames):
            if d == "__pycache__":
                shutil.rmtree(os.path.join(dirpath, d))
                dirnames.remove(d)
    shutil.rmtree(os.path.join(site, "bin"), ignore_errors=True)
    env = dict(os.environ, XZ_OPT="-6 -T0")
    subprocess.run(["tar", "--sort=name", "--owner=0", "--group=0", "--numeric-owner",
                    "--mtime=@0", "-cJf", archive, "-C", site, "."], check=True, env=env)


def tree_bytes() -> int:
    """The tracked tree's size: what a call carries beside the bundle."""
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.split(b"\0")
    return sum(os.path.getsize(os.path.join(ROOT, p.decode()))
               for p in out if p and os.path.isfile(os.path.join(ROOT, p.decode())))


def build(target: str, version: str, out: str) -> dict:
    version = check_version(version)
    held, left = selection(target, version)
    started = time.monotonic()
    parent = os.path.dirname(os.path.abspath(out)) or "."
    staging = tempfile.mkdtemp(prefix=os.path.basename(out) + ".staging-", dir=parent)
    os.chmod(staging, 0o755)  # mkdtemp's 0700 would follow the bundle into place
    try:
        site = os.path.join(staging, "site")
        os.makedirs(site)
        reqs = [h["pin"] for n, h in held.items() if n != target]
        if target == "vllm":
            # the wheel's Python files only (433 MB wheel, ~11 MB of .py), downloaded once
            # into .releases/.downloads as the release environment's set-up does
            from targets.wheels import EnvError, download, unpack_python
            try:
                unpack_python(download("vllm", version), site)
            except EnvError as exc:
                raise BundleError(str(exc)) from None
        else:
            reqs.append(held[target]["pin"])
        _pip_target(reqs, site)
        archive = os.path.join(staging, "site.tar.xz")
        _pack(site, archive)
        shutil.rmtree(site)
        size = os.path.getsize(archive)
        tree = tree_bytes()
        manifest = {"target": target, "version": version, "python": PYTHON_TAG,
                    "platform": "manylinux x86_64", "bytes": size, "tree_bytes": tree,
                    "packages": held, "left_out": left,
                    "build_s": round(time.monotonic() - started, 1)}
        with open(os.path.join(staging, "MANIFEST.json"), "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
        if size + tree > CARRY_LIMIT:
            raise BundleError(f"{target} {version}'s bundle is {size / 2**20:.1f} MiB; with "
                              f"the tree ({tree / 2**20:.1f} MiB) it is over a call's "
                              f"{CARRY_LIMIT >> 20} MiB carry")
        _swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


def _swap_in(staging: str, final: str) -> None:
    """``staging`` renamed to ``final``; a previous bundle moved aside first and removed
    only once the new one is in place (a reader never finds half a bundle)."""
    old = None
    if os.path.exists(final):
        old = final + f".old-{os.getpid()}"
        os.rename(final, old)
    try:
        os.rename(staging, final)
    except OSError:
        if old:
            os.rename(old, final)
        raise
    if old:
        shutil.rmtree(old, ignore_errors=True)


IMAGE_ENV = os.path.join(ROOT, ".gpuimage")


def python312() -> str:
    """A CPython 3.12 here (the bundles' wheels are cp312): ``$PY312``, else
    ``python3.12`` on PATH, else pyenv's; each asked for its version (a pyenv shim of a
    version not selected is on PATH but fails)."""
    import glob
    candidates = [os.environ.get("PY312", ""), shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")),
                         reverse=True)
    for c in filter(None, candidates):
        r = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2] == (3, 12))"],
                           capture_output=True, text=True)
        if r.returncode == 0 and r.stdout.strip() == "True":
            return c
    raise BundleError("no CPython 3.12 here for the GPU image's stand-in (set PY312=PATH, "
                      "or install one: pyenv install 3.12)")


def build_image(out: str = IMAGE_ENV) -> str:
    """The GPU image's Python set (``image.txt``) in a CPython 3.12 venv at ``out``, for
    the import check; built beside it and swapped in whole. Its ``.ready`` holds the
    image.txt it was built from (make rebuilds when that changes)."""
    python = python312()
    parent = os.path.dirname(os.path.abspath(out))
    staging = tempfile.mkdtemp(prefix=os.path.basename(out) + ".staging-", dir=parent)
    try:
        subprocess.run([python, "-m", "venv", "--clear", staging], check=True)
        # --no-deps: exactly the file's set (pip would pull in what the image lacks)
        r = subprocess.run([os.path.join(staging, "bin", "python"), "-m", "pip", "install",
                            "-q", "--no-deps", "-r", IMAGE], capture_output=True, text=True)
        if r.returncode:
            raise BundleError(f"the image's set did not install: {r.stderr.strip()[-300:]}")
        shutil.copy(IMAGE, os.path.join(staging, ".ready"))
        # renamed into place: bin/python and sys.prefix follow the folder (only the
        # console scripts' shebangs name the staging path; nothing here runs them)
        _swap_in(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def main(argv: List[str]) -> int:
    usage = "usage: tools/gpu/bundle.py sglang|vllm VERSION [OUT] | image"
    if argv == ["image"]:
        try:
            started = time.monotonic()
            build_image()
        except BundleError as exc:
            print(f"bundle: error: {exc}", file=sys.stderr)
            return 2
        print(f"bundle: .gpuimage: the GPU image's set for the import check, "
              f"built in {time.monotonic() - started:.0f} s")
        return 0
    if len(argv) not in (2, 3) or argv[0] not in TARGETS:
        print(usage, file=sys.stderr)
        return 2
    target, version = argv[0], argv[1]
    out = os.path.join(ROOT, argv[2] if len(argv) == 3 else TARGETS[target]["out"])
    try:
        m = build(target, version, out)
    except BundleError as exc:
        print(f"bundle: error: {exc}", file=sys.stderr)
        return 2
    print(f"bundle: {os.path.relpath(out, ROOT)}/site.tar.xz: {target} {m['version']}, "
          f"{len(m['packages'])} packages, {m['bytes'] / 2**20:.1f} MiB (with the tree "
          f"{(m['bytes'] + m['tree_bytes']) / 2**20:.1f} of {CARRY_LIMIT >> 20} MiB), "
          f"built in {m['build_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
