"""What an offline GPU machine (Python 3.12, its own torch) needs to run the vLLM target
on vLLM release VERSION, into ``.vllmgpu/`` (git-ignored; carried with the device tool's
``carry``, 64 MiB a call with the tree), as two xz trees ready to unpack (xz over the
installed files is ~40% smaller than the wheels):

* ``vsite.tar.xz`` -- the release environment's ``vllm`` package (only the wheel's
  ``.py`` files, as ``make upstream TARGET=vllm`` unpacked them) and its dist-info (the
  version and RECORD the contract reads), with the release's own pins (its lock,
  ``targets/vllm/environments/locks/VERSION.txt``) less those the driven path never
  imports (``UNUSED``), installed for CPython 3.12;
* ``vcore.tar.xz`` -- the core packages vLLM's driven modules and specrace import, at the
  core's versions, which the GPU image lacks or may lack.

``tools/gpu/vllm_gpu_env.sh`` unpacks them there (PYTHONPATH=/tmp/vsite:/tmp/vcore).
Usage (here, with the release set up):  .venv/bin/python tools/gpu/vllm_bundle.py 0.17.0 [DIR]
(DIR, default ``.vllmgpu``: a second release's bundle beside the first, e.g. ``.vllmgpu-0.27.1``,
so that one tool message can run both, each call carrying its own.)
"""
from __future__ import annotations

import glob
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, ".vllmgpu")
# Pinned by the release but not imported on the driven path (a trial's sys.modules).
UNUSED = {"xgrammar": "imported lazily, for structured outputs (not driven); the core's "
                      "xgrammar serves specrace",
          "uvloop": "the API server's event loop",
          "llguidance": "the guidance structured-output backend and Mistral's tokenizer "
                        "(neither driven; 1.7.6 has no cp312 wheel on the index)",
          "opencv-python-headless": "multimodal inputs (170 MiB installed; a trial never "
                                    "imports cv2)",
          # imported, but the GPU image's own serves (as for releases that do not pin it)
          "numpy": "the GPU image's numpy (torch's)", "compressed-tensors": "quantized weights"}
# Imported by a vLLM trial from the core venv (a run's sys.modules), less torch's own and
# transformers 5's / huggingface_hub 1's dependencies (the image has them): specrace's
# GPU set (as tools/gpu/gpu_wheels.sh) and what vLLM's modules import beside.
CORE = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection",
        "typing-extensions", "xgrammar", "apache-tvm-ffi", "jsonschema",
        "jsonschema-specifications", "referencing", "rpds-py", "msgspec", "pyzmq", "openai",
        "jiter", "distro", "sniffio", "gguf", "dill", "pybase64", "opentelemetry-api",
        "einops", "sentencepiece", "aiohttp", "aiohappyeyeballs", "aiosignal", "frozenlist",
        "multidict", "propcache", "yarl", "attrs", "psutil", "more-itertools",
        "importlib-metadata", "zipp", "charset-normalizer", "urllib3", "requests", "click")
PLATFORMS = ("manylinux_2_34_x86_64", "manylinux_2_28_x86_64", "manylinux_2_27_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_24_x86_64", "manylinux_2_17_x86_64",
             "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux_2_12_x86_64",
             "manylinux1_x86_64", "manylinux_2_5_x86_64")


def install(reqs, dest: str) -> None:
    """``reqs`` installed for CPython 3.12 on x86_64 Linux into ``dest`` (no deps)."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile",
           "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
           "--target", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    for req in reqs:  # one at a time: one missing wheel names itself
        r = subprocess.run(cmd + [req], capture_output=True, text=True)
        if r.returncode:
            raise SystemExit(f"no cp312 wheel for {req}: {r.stderr.strip()[-300:]}")


def _pinned(name: str) -> str:
    try:
        return f"{name}=={md.version(name)}"
    except md.PackageNotFoundError:  # vendored in the core (setuptools'): the newest
        return name


def pack(src: str, out: str, name: str) -> None:
    with tarfile.open(os.path.join(out, name), "w:xz") as tar:
        for entry in sorted(os.listdir(src)):
            if entry != "bin":
                tar.add(os.path.join(src, entry), entry,
                        filter=lambda t: None if "__pycache__" in t.name else t)


def main(version: str, out: str = OUT) -> int:
    release = os.path.join(ROOT, ".releases", "vllm", version)
    sites = glob.glob(os.path.join(release, "lib", "python3*", "site-packages"))
    lock = os.path.join(ROOT, "targets", "vllm", "environments", "locks", f"{version}.txt")
    if not sites or not os.path.exists(lock):
        print(f"vllm {version} is not set up here: make upstream TARGET=vllm VLLM={version}")
        return 2
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    pinned = [ln.strip() for ln in open(lock) if ln.strip() and not ln.startswith("#")
              and ln.split("==")[0].strip().lower() not in UNUSED]
    with tempfile.TemporaryDirectory() as tmp:
        vsite, vcore = os.path.join(tmp, "vsite"), os.path.join(tmp, "vcore")
        install(pinned, vsite)
        shutil.copytree(os.path.join(sites[0], "vllm"), os.path.join(vsite, "vllm"),
                        ignore=shutil.ignore_patterns("__pycache__"))
        for info in glob.glob(os.path.join(sites[0], f"vllm-{version}.dist-info")):
            shutil.copytree(info, os.path.join(vsite, os.path.basename(info)))
        pack(vsite, out, "vsite.tar.xz")
        pinned_names = {p.split("==")[0].lower() for p in pinned}
        install([_pinned(n) for n in CORE if n not in pinned_names], vcore)
        pack(vcore, out, "vcore.tar.xz")
    total = sum(os.path.getsize(f) for f in glob.glob(os.path.join(out, "*")))
    print(f"{out}: {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "0.17.0",
                  os.path.join(ROOT, sys.argv[2]) if len(sys.argv) > 2 else OUT))
