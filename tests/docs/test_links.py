"""Every pointer the README, docs/ and the error messages give resolves: each relative
markdown link (its file, and its #anchor among the target's headings), each repo path
written in backticks, each `make X` target, each `specrace <command>`, and each pointer a
message string in the source gives (``docs/….md#…``, ``reports/…``, "README …").

Static: the files are read, nothing is run. A path git ignores counts as present (it is
what a command writes: ``.venv/``, ``reports/runs/``)."""
from __future__ import annotations

import ast
import fnmatch
import re
import subprocess
from pathlib import Path
from typing import Iterable, List, Set

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```.*?^```", re.M | re.S)
INLINE = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)
# a path-like token: has a folder part, and ends in an extension or a slash
PATHLIKE = re.compile(r"^[\w.][\w./-]*/(?:[\w.-]*\.\w+|)$")
LINE_REF = re.compile(r"(?::\d+(?:[-/]\d+)*)+$")
# a command where a shell would run one: a line's start, after a prompt, `&&`, `;`, `|`,
# a CI step's `run:`, or a venv's bin/ (prose inside a block is not a command)
AT_COMMAND = r"(?:^[ \t]*|[;&|(]\s*|run:\s*|\$\s*|bin/)"
MAKE = re.compile(AT_COMMAND + r"make\s+(?:-C\s+\S+\s+|-\S+\s+)*(?:[A-Z_][A-Z0-9_]*=\S*\s+)*"
                  r"([a-z][\w-]*)", re.M)
SPECRACE = re.compile(AT_COMMAND + r"specrace\s+([a-z][\w-]*)", re.M)
SOURCE_POINTER = re.compile(r"(?<![\w./-])(?:docs|reports)/[\w./-]*\w\.(?:md|json|py|txt)(?:#[\w-]+)?"
                            r"|(?<![\w./-])README(?:\.md(?:#[\w-]+)?)?")


# --- reading markdown ----------------------------------------------------------------------

def anchors(text: str) -> Set[str]:
    """The #anchors GitHub gives a document's headings (lower case, punctuation dropped,
    spaces to hyphens; a repeated heading gets -1, -2, ...)."""
    seen: Set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        n, candidate = 0, slug
        while candidate in seen:
            n += 1
            candidate = f"{slug}-{n}"
        seen.add(candidate)
    return seen


def code_texts(text: str) -> List[str]:
    """The code a document shows: its fenced blocks and its inline spans."""
    blocks = FENCE.findall(text)
    return blocks + INLINE.findall(FENCE.sub("", text))


def _ignored(paths: Iterable[Path]) -> Set[Path]:
    rels = [str(p.relative_to(ROOT)) for p in paths if ROOT in p.parents]
    if not rels:
        return set()
    if not (ROOT / ".git").exists():
        # a copy of the tree without its history (the GPU machine's): the root .gitignore
        return {ROOT / r for r in rels if _gitignore_matches(r)}
    # an absent path may be a file or a folder: a folder pattern (/reports/audit/) matches
    # only the path written as a folder, so both are asked
    out = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "--no-index", "--stdin"],
                         input="\n".join(rels + [r + "/" for r in rels]),
                         capture_output=True, text=True, timeout=60).stdout
    return {ROOT / line.rstrip("/") for line in out.split()}


def _gitignore_matches(rel: str) -> bool:
    """``rel`` or a folder above it matches a pattern of the root .gitignore (its patterns
    are plain globs: anchored with a leading /, folders with a trailing /)."""
    patterns = [line.strip() for line in (ROOT / ".gitignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    parts = rel.split("/")
    prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
    for pattern in patterns:
        glob = pattern.strip("/")
        anchored = pattern.startswith("/")
        for prefix in prefixes:
            name = prefix if anchored else prefix.rsplit("/", 1)[-1]
            if fnmatch.fnmatchcase(name, glob):
                return True
    return False


def _missing(targets: List[Path]) -> List[Path]:
    absent = [t for t in targets if not t.exists()]
    ignored = _ignored(absent)
    return [t for t in absent if t not in ignored]


# --- the checks (each returns what is dead, so a planted case can be shown to fail) --------

def dead_links(doc: Path, text: str) -> List[str]:
    """Relative links whose file, or whose #anchor in that file, does not exist."""
    dead = []
    for target in LINK.findall(INLINE.sub("", FENCE.sub("", text))):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        if not file_part:  # this page's own heading
            dead += [target] if anchor not in anchors(text) else []
            continue
        path = (doc.parent / file_part).resolve()
        if _missing([path]):
            dead.append(target)
        elif anchor and path.suffix == ".md" and anchor not in anchors(path.read_text()):
            dead.append(target)
    return dead


def repo_paths(doc: Path, text: str) -> List[Path]:
    """The repository paths a document writes in backticks: a token with a folder part and
    an extension (or a trailing slash) whose first part is a top-level entry of the tree
    (``vllm/v1/utils.py`` is upstream's, not ours), line numbers and anchors dropped;
    placeholders (``NAME``, ``*``, ``$OUT``) are not paths."""
    tops = {p.name for p in ROOT.iterdir()} - {".git"}
    found = []
    for span in INLINE.findall(FENCE.sub("", text)):
        token = LINE_REF.sub("", span.split("#")[0].rstrip(".,;:)"))
        if not PATHLIKE.match(token) or re.search(r"(^|/)[A-Z]+(/|$)|\.\.\.", token):
            continue
        base = doc.parent if token.startswith(("./", "../")) else ROOT
        path = (base / token).resolve()
        if ROOT in path.parents and path.relative_to(ROOT).parts[0] in tops:
            found.append(path)
    return found


def dead_paths(doc: Path, text: str) -> List[str]:
    return [str(p.relative_to(ROOT)) for p in _missing(repo_paths(doc, text))]


def make_targets() -> Set[str]:
    names: Set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([\w.-]+(?:\s+[\w.-]+)*)\s*:(?!=)", line)
        if m:
            names.update(m.group(1).split())
    return names


def unknown_make_targets(text: str, known: Set[str]) -> List[str]:
    return [t for code in code_texts(text) for t in MAKE.findall(code) if t not in known]


def subcommands() -> Set[str]:
    """Every ``add_parser("name", ...)`` under specrace/: the CLI's subcommands."""
    names: Set[str] = set()
    for path in (ROOT / "specrace").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_parser"
                    and node.args and isinstance(node.args[0], ast.Constant)):
                names.add(node.args[0].value)
    return names


def unknown_subcommands(text: str, known: Set[str]) -> List[str]:
    return [c for code in code_texts(text) for c in SPECRACE.findall(code) if c not in known]


def message_pointers(source: str) -> List[str]:
    """What the string literals of a module (its docstrings aside) point a reader at."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    return [hit for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docstrings
            for hit in SOURCE_POINTER.findall(node.value)]


def dead_pointers(pointers: Iterable[str]) -> List[str]:
    """A pointer that names no file, an absent file, or an absent #anchor. "README" alone
    (a section by name) cannot be followed: point at README.md#anchor or a docs page."""
    dead = []
    for pointer in pointers:
        file_part, _, anchor = pointer.partition("#")
        path = ROOT / file_part
        if file_part == "README" or _missing([path]):
            dead.append(pointer)
        elif anchor and anchor not in anchors(path.read_text()):
            dead.append(pointer)
    return dead


def _sources() -> List[Path]:
    # the tree's own Python files (hidden folders -- .venv, .releases, bundles -- are
    # set-up outputs): by walking, so a copy of the tree without .git is read the same
    return sorted(p for p in ROOT.rglob("*.py")
                  if not any(part.startswith(".") or part == "__pycache__"
                             for part in p.relative_to(ROOT).parts)
                  and p.relative_to(ROOT).parts[0] not in ("tests", "build"))


# --- the tree as it is ----------------------------------------------------------------------

def _name(doc: Path) -> str:
    return str(doc.relative_to(ROOT))


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_link_resolves(doc):
    assert dead_links(doc, doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_path_in_backticks_exists(doc):
    assert dead_paths(doc, doc.read_text()) == []


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_make_target_exists(doc):
    assert unknown_make_targets(doc.read_text(), make_targets()) == []


@pytest.mark.parametrize("doc", DOCS, ids=_name)
def test_every_specrace_command_exists(doc):
    assert unknown_subcommands(doc.read_text(), subcommands()) == []


def test_every_pointer_a_message_gives_resolves():
    dead = {str(p.relative_to(ROOT)): bad for p in _sources()
            if (bad := dead_pointers(message_pointers(p.read_text())))}
    assert dead == {}


def test_the_checks_find_something_to_check():
    """A check that reads nothing passes on anything: each one reads real pointers."""
    text = (ROOT / "README.md").read_text()
    assert LINK.findall(text) and MAKE.findall("\n".join(code_texts(text)))
    assert SPECRACE.findall("\n".join(code_texts(text)))
    assert len(repo_paths(ROOT / "docs" / "cli.md", (ROOT / "docs" / "cli.md").read_text())) > 5
    assert {"repro", "replay", "audit"} <= subcommands() and {"test", "repro"} <= make_targets()
    assert sum(len(message_pointers(p.read_text())) for p in _sources()) > 5


# --- planted faults: each check fails on one --------------------------------------------------

PLANTED = """# A page

## Real heading

[fine](#real-heading) [gone](no-such-page.md) [bad anchor](#no-such-heading)
[fine too](../README.md#quick-start) `harness/run.py` `harness/no_such_module.py`
`vllm/v1/utils.py:132` `reports/runs/NAME/report.json`

```bash
make test
make no-such-target
specrace repro ngram-filter-race
specrace no-such-command
```
"""


@pytest.fixture()
def planted():
    doc = ROOT / "docs" / "PLANTED.md"  # its links resolve from docs/, as a page there
    return doc, PLANTED


def test_a_dead_link_and_a_dead_anchor_are_found(planted):
    assert dead_links(*planted) == ["no-such-page.md", "#no-such-heading"]


def test_a_dead_path_is_found_and_upstream_or_generated_paths_are_not(planted):
    assert dead_paths(*planted) == ["harness/no_such_module.py"]


def test_an_unknown_make_target_is_found(planted):
    assert unknown_make_targets(planted[1], make_targets()) == ["no-such-target"]


def test_an_unknown_specrace_command_is_found(planted):
    assert unknown_subcommands(planted[1], subcommands()) == ["no-such-command"]


def test_a_dead_message_pointer_is_found():
    source = '''"""Docstrings are prose, not pointers: README section Anything."""
def f():
    raise SystemExit("no sglang: set it up (README: Verifying installed sglang)")
def g():
    raise SystemExit("see docs/cli.md#no-such-section or docs/gone.md, or docs/cli.md")
'''
    assert dead_pointers(message_pointers(source)) == ["README", "docs/cli.md#no-such-section",
                                                       "docs/gone.md"]


def test_a_planted_dead_link_in_a_temporary_file_is_found(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[there](other.md) [not there](missing.md#x)\n")
    (tmp_path / "other.md").write_text("# Other\n")
    assert dead_links(page, page.read_text()) == ["missing.md#x"]
