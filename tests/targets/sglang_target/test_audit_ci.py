"""The CI recipe of docs/ci.md, run against the installed sglang: ``specrace audit
--fail-on new`` passes on the release as shipped (its races are known ones, linked) and
fails once a new race is seeded into the server's source -- a seeded bug of the mutation
catalogue (``mutations/``) written into a copy of the package that is put first on
``PYTHONPATH``, as a pull request's editable checkout would be -- and the pytest entry
point (``specrace_audit``) fails a server's test the same way.

Scenarios are named (``--scenario``) to keep each run to seconds: the recipe's command
without them runs all of them (minutes). Expected verdicts come from each scenario's own
table (``Scenario.expected``), never from here."""
import ast
import json
import os
import subprocess
import sys
import textwrap

from scenarios.registry import SCENARIOS
from seams.paths import REPO_ROOT
from specrace.audit_view import meets

# the seeded bug: upstream's WAR barrier ordering nothing (mutations/sglang.py); the
# scenario it bites in one configuration, and one it leaves alone with a known race
SEEDED = "war-barrier-removed"
BITES, KNOWN_RACE = "slot-reuse", "ngram-hidden-readback"


def _specrace(*args, pythonpath=None):
    """The recipe's ``specrace`` command: the console script beside this interpreter,
    with ``pythonpath`` (a checkout's source) ahead of the installed server."""
    script = os.path.join(os.path.dirname(sys.executable), "specrace")
    cmd = [script] if os.path.exists(script) else [sys.executable, "-m", "specrace.cli"]
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    return subprocess.run(cmd + list(args), capture_output=True, text=True, env=env,
                          cwd=REPO_ROOT, timeout=900)


def _seeded_checkout(dest: str) -> str:
    """A copy of the installed sglang with the seeded bug written into its source: every
    file a link to the installed one but the patched module (its compiled cache dropped).
    Returns the folder to put on ``PYTHONPATH``."""
    from mutations.sglang import MUTATIONS
    from targets import static
    mutation = {m.name: m for m in MUTATIONS}[SEEDED]
    root = static.package_root("sglang")
    pkg = os.path.join(dest, "sglang")
    for dirpath, _, files in os.walk(root):
        here = os.path.join(pkg, os.path.relpath(dirpath, root))
        os.makedirs(here, exist_ok=True)
        for name in files:
            os.symlink(os.path.join(dirpath, name), os.path.join(here, name))
    module, _, qualname = mutation.target.partition(":")
    path = static.module_path(pkg, module)
    with open(os.path.realpath(path), encoding="utf-8") as f:
        text = f.read()
    node = ast.parse(text)
    for name in qualname.split("."):  # the function the bug's snippets are unique in
        node = next(n for n in node.body if getattr(n, "name", None) == name)
    lines = text.splitlines(keepends=True)
    body = "".join(lines[node.lineno - 1:node.end_lineno])
    for old, new in mutation.edits:
        assert body.count(old) == 1, f"{SEEDED} no longer fits sglang's source"
        body = body.replace(old, new)
    os.unlink(path)
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.basename(path)[:-3] + "."
    for name in os.listdir(cache) if os.path.isdir(cache) else ():
        if name.startswith(stem):
            os.unlink(os.path.join(cache, name))
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(lines[:node.lineno - 1]) + body + "".join(lines[node.end_lineno:]))
    return dest


def test_the_recipe_passes_on_the_release_as_shipped_its_races_known(tmp_path):
    out = tmp_path / "reports"
    proc = _specrace("audit", "--target", "sglang", "--scenario", BITES, "--scenario",
                     KNOWN_RACE, "--fail-on", "new", "--report-dir", str(out))
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads((out / "audit.json").read_text())
    assert (out / "audit.md").exists() and doc["failing"] == 0
    for row in doc["rows"]:
        stated = SCENARIOS[row["scenario"]].expect.get((row["variant"], None))
        if stated:  # the scenario's own table says what the release as shipped gives
            assert row["verdict"] == stated, row
        if row["verdict"] == "race":
            assert row["known"] and not row["new"], row  # linked, not new
            assert os.path.exists(row["report"]), row
            assert os.path.isfile(os.path.join(REPO_ROOT, row["known"]["writeup"].split("#")[0]))
            assert meets(row, "race")  # the stricter gate fails on every race, known too
    assert {r["scenario"] for r in doc["rows"]} == {BITES, KNOWN_RACE}
    assert "known race" in proc.stdout and "report:" in proc.stdout


def test_the_recipe_fails_on_a_seeded_new_race(tmp_path):
    checkout = _seeded_checkout(str(tmp_path / "checkout"))
    proc = _specrace("audit", "--target", "sglang", "--scenario", BITES, "--fail-on", "new",
                     "--report-dir", str(tmp_path / "reports"), pythonpath=checkout)
    assert proc.returncode == 1, proc.stderr[-2000:]
    err = proc.stderr.strip().splitlines()
    assert any(ln.startswith("specrace: audit:") and "--fail-on new" in ln for ln in err)
    doc = json.loads((tmp_path / "reports" / "audit.json").read_text())
    bad = [r for r in doc["rows"] if r["new"]]
    assert bad and all(r["verdict"] == "race" and r["known"] is None for r in bad)
    # the checkout is not the wheel's files: the release is no longer "verified"
    assert doc["releases"][0]["target_info"]["sglang_tier"] == "compatible"


def test_the_pytest_entry_point_fails_a_servers_test_on_the_seeded_race(tmp_path):
    from tests.specrace.specrace_process import pytest_plugin_args
    checkout = _seeded_checkout(str(tmp_path / "checkout"))
    test = tmp_path / "test_server.py"
    test.write_text(textwrap.dedent(f"""
        def test_no_new_race(specrace_audit):
            specrace_audit(target="sglang", scenarios=["{BITES}"])
    """))
    # the checkout first (it shadows the installed sglang), the rest of the path kept: on
    # a GPU image sglang itself is on PYTHONPATH (the bundle), not installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (checkout, REPO_ROOT, os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           *pytest_plugin_args(), str(test)], capture_output=True, text=True,
                          env=env, cwd=str(tmp_path), timeout=900)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "meet --fail-on new" in proc.stdout and BITES in proc.stdout
