"""What an offline GPU machine (Python 3.12, its own torch) needs to run the vLLM target
on vLLM release VERSION, into ``.vllmgpu/`` (git-ignored; carried with the device tool's
``carry``, 64 MiB a call):

* ``vllm-py.tar.gz`` -- the release environment's ``vllm`` package (only the wheel's
  ``.py`` files, as ``make upstream TARGET=vllm`` unpacked them) and its dist-info (the
  version and RECORD the contract reads);
* ``wheels/`` -- cp312 wheels, with no dependencies, of the release's own pins (its lock:
  ``targets/vllm/environments/locks/VERSION.txt``) less those the driven path never
  imports (``UNUSED``), and of the core packages vLLM's driven modules and specrace
  import, at the core's versions. ``tools/gpu/vllm_gpu_env.sh`` installs the pinned ones
  always and the core ones only where the machine cannot import them; it expects the
  core's GPU set (``tools/gpu/gpu_wheels.sh``) in ``/tmp/site`` from the call before.

Usage (here, with the release set up):  .venv/bin/python tools/gpu/vllm_bundle.py 0.17.0
"""
from __future__ import annotations

import glob
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tarfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, ".vllmgpu")
# Pinned by the release but not imported on the driven path (a trial's sys.modules): they
# stay behind, which keeps the bundle within a call's 64 MiB.
UNUSED = {"xgrammar": "imported lazily, for structured outputs (not driven); the core's "
                      "xgrammar serves specrace",
          "uvloop": "the API server's event loop", "compressed-tensors": "quantized weights"}
# Imported by a vLLM trial from the core venv (a run's sys.modules), less what the machine
# has anyway: torch's, transformers 5's and huggingface_hub 1's own dependencies (on the
# image), and the core's GPU set (tools/gpu/gpu_wheels.sh: pydantic, xgrammar, jsonschema,
# msgspec, pyzmq, openai, ... installed into /tmp/site by the call before). Installed only
# where the machine cannot import them.
CORE = ("einops", "sentencepiece", "aiohttp", "aiohappyeyeballs", "aiosignal",
        "frozenlist", "multidict", "propcache", "yarl", "attrs", "psutil",
        "more-itertools", "importlib-metadata", "zipp", "charset-normalizer", "urllib3",
        "requests", "click")
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_24_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64", "manylinux_2_5_x86_64")


def download(reqs, dest: str) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", "3.12", "--implementation", "cp", "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    for req in reqs:  # one at a time: one missing wheel names itself
        r = subprocess.run(cmd + [req], capture_output=True, text=True)
        if r.returncode:
            print(f"  no cp312 wheel for {req}: {r.stderr.strip().splitlines()[-1:]}")


def main(version: str) -> int:
    release = os.path.join(ROOT, ".releases", "vllm", version)
    sites = glob.glob(os.path.join(release, "lib", "python3*", "site-packages"))
    lock = os.path.join(ROOT, "targets", "vllm", "environments", "locks", f"{version}.txt")
    if not sites or not os.path.exists(lock):
        print(f"vllm {version} is not set up here: make upstream TARGET=vllm VLLM={version}")
        return 2
    site = sites[0]
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(os.path.join(OUT, "wheels", "pinned"))
    os.makedirs(os.path.join(OUT, "wheels", "core"))
    with tarfile.open(os.path.join(OUT, "vllm-py.tar.gz"), "w:gz") as tar:
        tar.add(os.path.join(site, "vllm"), "vllm",
                filter=lambda t: None if "__pycache__" in t.name else t)
        for info in glob.glob(os.path.join(site, f"vllm-{version}.dist-info")):
            tar.add(info, os.path.basename(info))
    pinned = [ln.strip() for ln in open(lock) if ln.strip() and not ln.startswith("#")
              and ln.split("==")[0].strip().lower() not in UNUSED]
    download(pinned, os.path.join(OUT, "wheels", "pinned"))
    pinned_names = {p.split("==")[0].lower() for p in pinned}
    core = []
    for name in CORE:
        if name in pinned_names:
            continue
        try:
            core.append(f"{name}=={md.version(name)}")
        except md.PackageNotFoundError:
            core.append(name)
    download(core, os.path.join(OUT, "wheels", "core"))
    total = sum(os.path.getsize(f) for f in glob.glob(os.path.join(OUT, "**"), recursive=True)
                if os.path.isfile(f))
    print(f"{OUT}: {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "0.17.0"))
