"""A GPU bundle checked on the CPU: unpacked into an empty folder, the driven path of its
target imported by the GPU image's interpreter with nothing beside the image's set
(``.gpuimage/``, ``make gpu-image``: CPython 3.12 with ``tools/gpu/image.txt``), the
bundle and the repo -- as on the GPU (``PYTHONPATH=/tmp/site:.``). A package the bundle
lacks fails here, not on a GPU run.

    python tools/gpu/check_bundle.py BUNDLE [--python PY] [--trial]

What is imported: the target as specrace loads it (``targets.declared(T).load()``: the
contract, the platform, the stand-ins for absent GPU-only packages, the driven upstream
modules), every module of ``targets/T`` (the engines, runners, slices: EngineCore,
AsyncScheduler, GPUModelRunner, Model Runner V2 for vLLM), every upstream module they
name that the release ships, and specrace's console. ``--trial`` then runs one traced
trial per driven family on the simulator, for what a run imports past load. Every module
loaded must come from the bundle, the repo or the interpreter's own prefix (the image).
Prints one JSON line; exit 0 when it all imports, 1 when not, 2 on bad input.

On the CPU, ``torch.cuda.is_available()`` is false: modules upstream imports only on a
GPU (sglang's CUDA platform) are not reached here.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_PYTHON = os.path.join(ROOT, ".gpuimage", "bin", "python")
# One process's import of the driven path: sglang's pulls ~5,000 modules (10-40 s here).
IMPORT_DEADLINE_S = 600
TRIAL_DEADLINE_S = 600
# One scenario per driven family: a run imports what load() does not (the engine loop,
# the toy model, the runner's kernels' stand-ins)
TRIALS = {
    "sglang": (("ngram-filter-race", "--variant", "pre-fix", "--war-barrier", "fine"),
               ("dspark-result-readback",)),
    "vllm": (("vllm-seq-lens-shadow",), ("vllm-mrv2",), ("vllm-draft-tokens",)),
}

# The modules each target drives, which must be among those imported whatever the target's
# code names (sglang: bootstrap.MODULES; vLLM: EngineCore, AsyncScheduler, the V1
# GPUModelRunner, Model Runner V2's)
DRIVEN = {
    "sglang": ("sglang.srt.managers.overlap_utils", "sglang.srt.speculative.ngram_info",
               "sglang.srt.managers.schedule_batch", "sglang.srt.managers.utils",
               "sglang.srt.managers.scheduler", "sglang.srt.speculative.spec_utils",
               "sglang.srt.constrained.xgrammar_backend"),
    "vllm": ("vllm.v1.engine.core", "vllm.v1.core.sched.async_scheduler",
             "vllm.v1.worker.gpu_model_runner", "vllm.v1.worker.gpu.model_runner"),
}

# Run by the image's interpreter in the empty folder; argv: target, site, repo root, and
# the driven modules.
PROBE = r'''
import importlib, json, os, pkgutil, re, sys, warnings
target, site, root = sys.argv[1:4]
driven = sys.argv[4:]
warnings.simplefilter("ignore")
failures = []
import targets
t = targets.declared(target)
try:
    t.load()
except Exception as exc:
    failures.append(("load", f"{type(exc).__name__}: {exc}"[:400]))
pkg = importlib.import_module("targets." + target)
named = set()
for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
    try:
        mod = importlib.import_module(info.name)
    except Exception as exc:
        failures.append((info.name, f"{type(exc).__name__}: {exc}"[:400]))
        continue
    src = getattr(mod, "__file__", None)
    if src and src.endswith(".py"):
        named |= set(re.findall(r'"(%s\.[A-Za-z_0-9.]+)"' % target, open(src).read()))
shipped = []
for name in sorted(named | set(driven)):  # fault points share the dotted form: only modules it ships
    rel = os.path.join(site, *name.split("."))
    if os.path.exists(rel + ".py") or os.path.exists(os.path.join(rel, "__init__.py")):
        shipped.append(name)
for name in shipped:
    try:
        importlib.import_module(name)
    except Exception as exc:
        failures.append((name, f"{type(exc).__name__}: {exc}"[:400]))
try:
    import specrace.cli  # noqa: F401
except Exception as exc:
    failures.append(("specrace.cli", f"{type(exc).__name__}: {exc}"[:400]))
# in this order: the image venv may lie inside the repo (.gpuimage/); of the repo only
# its own tree counts (never .venv/ or .releases/, this machine's environments)
prefixes = {"bundle": os.path.realpath(site), "image": os.path.realpath(sys.prefix),
            "python": os.path.realpath(sys.base_prefix), "repo": os.path.realpath(root)}
where, outside = {}, []
for name, mod in list(sys.modules.items()):
    f = getattr(mod, "__file__", None)
    if not f or not os.path.isabs(f):  # torch.ops / torch.classes name a bare "_ops.py"
        continue
    real = os.path.realpath(f)
    for label, p in prefixes.items():
        if real.startswith(p + os.sep) and not (
                label == "repo" and os.path.relpath(real, p).startswith(".")):
            where[label] = where.get(label, 0) + 1
            break
    else:
        outside.append(f)
used = set()
for mod in list(sys.modules.values()):
    f = getattr(mod, "__file__", None) or ""
    if os.path.realpath(f).startswith(prefixes["bundle"] + os.sep):
        used.add(os.path.relpath(os.path.realpath(f), prefixes["bundle"]).split(os.sep)[0])
stood_in = []
if target == "sglang":
    from targets.sglang.boundary import bootstrap
    stood_in = bootstrap.stood_in()
print(json.dumps({"target": target, "python": sys.version.split()[0],
                  "modules": sum(where.values()), "by_origin": where,
                  "upstream_named": len(shipped), "failures": failures,
                  "driven": {m: m in sys.modules for m in driven if m in shipped},
                  "outside": sorted(outside)[:20], "stood_in": stood_in,
                  "bundle_tops_used": sorted(used)}))
'''

TRIAL = r'''
import sys
sys.argv = ["specrace"] + sys.argv[1:]
from specrace.cli import main
sys.exit(main())
'''


def entry_points_only(folder: str) -> str:
    """A ``specrace`` dist-info holding only pyproject.toml's entry points, in ``folder``.
    On the CPU the sglang target runs on the simulator platform, which sglang finds as an
    entry point (``sglang.srt.platforms``) that ``make setup``'s editable install
    registers; a GPU needs none (sglang's CUDA platform), so the bundle has none."""
    import tomllib
    project = tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))["project"]
    info = os.path.join(folder, f"specrace-{project['version']}.dist-info")
    os.makedirs(info)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: specrace\nVersion: {project['version']}\n")
    with open(os.path.join(info, "entry_points.txt"), "w") as f:
        for group, eps in project.get("entry-points", {}).items():
            f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
    return folder


def image_env(site: str, meta: str) -> dict:
    """The process environment of a GPU run: the bundle and the repo on PYTHONPATH (as
    /tmp/site:. there), nothing else of this machine's Python set-up -- but specrace's
    entry points (``entry_points_only``), last."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")
           and not k.startswith("SPECRACE_") and k != "VIRTUAL_ENV"}
    env["PYTHONPATH"] = os.pathsep.join([site, ROOT, meta])
    env["PYTHONNOUSERSITE"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run_named(name: str, cmd, cwd: str, env: dict, deadline: float):
    """``cmd`` under a deadline that names it when it passes."""
    try:
        return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                              timeout=deadline)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"check_bundle: {name} did not finish in {deadline:.0f} s")


def check(bundle: str, python: str, trial: bool) -> dict:
    manifest = json.load(open(os.path.join(bundle, "MANIFEST.json")))
    target = manifest["target"]
    with tempfile.TemporaryDirectory(prefix="gpubundle-check-") as empty:
        site = os.path.join(empty, "site")
        os.makedirs(site)
        subprocess.run(["tar", "xJf", os.path.join(bundle, "site.tar.xz"), "-C", site],
                       check=True)
        work = os.path.join(empty, "cwd")  # the process's folder: empty
        os.makedirs(work)
        env = image_env(site, entry_points_only(os.path.join(empty, "meta")))
        r = run_named(f"the {target} import probe", [python, "-c", PROBE, target, site, ROOT,
                                                      *DRIVEN[target]],
                      work, env, IMPORT_DEADLINE_S)
        line = (r.stdout.strip().splitlines() or [""])[-1]
        try:
            out = json.loads(line)
        except ValueError:
            out = {"target": target, "failures": [("probe", (r.stderr or r.stdout)
                                                   .strip()[-1500:])]}
        out["version"] = manifest["version"]
        out["trials"] = []
        if trial and not out["failures"]:
            for scenario in TRIALS[target]:
                args = ["repro", *scenario, "--target", target, "--backend", "sim",
                        "--trials", "1", "--no-report"]
                t = run_named(f"the {target} trial {scenario[0]}",
                              [python, "-c", TRIAL, *args], work, env, TRIAL_DEADLINE_S)
                row = {"scenario": scenario[0], "rc": t.returncode}
                if t.returncode not in (0, 1):  # 1: a verdict other than the expected
                    row["tail"] = (t.stderr or t.stdout).strip()[-1500:]
                    out["failures"].append((f"trial {scenario[0]}", row["tail"]))
                out["trials"].append(row)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bundle", help="a bundle folder (.sgbundle, .vllmgpu)")
    ap.add_argument("--python", default=IMAGE_PYTHON,
                    help="the GPU image's interpreter here (default .gpuimage/bin/python)")
    ap.add_argument("--trial", action="store_true", help="also run one trial per family")
    args = ap.parse_args(argv)
    if not os.path.exists(os.path.join(args.bundle, "MANIFEST.json")):
        print(f"check_bundle: {args.bundle} is not a bundle (no MANIFEST.json; "
              f"make gpu-bundle-sglang / gpu-bundle-vllm)", file=sys.stderr)
        return 2
    if not os.access(args.python, os.X_OK):
        print(f"check_bundle: no image interpreter at {args.python} (make gpu-image)",
              file=sys.stderr)
        return 2
    want = json.load(open(os.path.join(args.bundle, "MANIFEST.json")))["python"]
    have = subprocess.run([args.python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                          capture_output=True, text=True, timeout=60).stdout.strip()
    if have != want:  # compiled wheels of another CPython would not load: no verdict
        print(f"check_bundle: the bundle is for CPython {want}; {args.python} is {have}",
              file=sys.stderr)
        return 2
    out = check(args.bundle, args.python, args.trial)
    print(json.dumps(out))
    return 1 if out["failures"] or out.get("outside") else 0


if __name__ == "__main__":
    sys.exit(main())
