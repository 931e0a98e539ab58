"""The sglang target's release environments: one venv per release with its own pins
(``targets.envs``), and which scenarios a release's code can run."""
from __future__ import annotations

import os

from seams.paths import REPO_ROOT
from targets import static
from targets.envs import LineEnvironments, ReleaseLine
from targets.sglang.boundary import contract

LINE = ReleaseLine(package="sglang", supported=contract.SUPPORTED,
                   requirements=os.path.join(REPO_ROOT, "requirements-upstream.txt"),
                   locks=os.path.join(os.path.dirname(os.path.abspath(__file__)), "locks"),
                   make_var="SGLANG")

# scenario -> the features (contract.FEATURES, SOURCE_FEATURES) its code needs
NEEDS = {"grammar-ngram": ("grammar_tree",), "grammar-tree-staging": ("grammar_tree",),
         "dspark-confidence-ring": ("dspark",),
         "dspark-result-readback": ("dspark", "leaf_result_copy"),
         "ngram-hidden-readback": ("leaf_result_copy",),
         "eagle-v2": ("eagle_v2",), "eagle-v2-grammar": ("eagle_v2",)}


# scenario -> the upstream code it is about ("module:qualname"): a release without it is
# "not applicable"; a release with it that lacks the rest of ``NEEDS`` (what specrace's
# slice builds on, often a later refactor's helper) is "not driven" -- the code is there
SHIPS = {"eagle-v2": ("sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2",),
         "eagle-v2-grammar": ("sglang.srt.speculative.eagle_worker_v2:EAGLEWorkerV2",),
         "dspark-confidence-ring": (
             "sglang.srt.speculative.dspark_components.dspark_planner:DSparkVerifyPlanner",),
         "dspark-result-readback": (
             "sglang.srt.speculative.dspark_components.dspark_planner:DSparkVerifyPlanner",)}


class SglangEnvironments(LineEnvironments):
    line = LINE

    def not_applicable(self, version: str, scenario: str) -> str:
        root = self.line.release_root(version)
        if scenario in SHIPS:
            absent = next((t for t in SHIPS[scenario] if root and not _has(root, t)), "")
        else:
            absent = self._first_missing(version, scenario, contract.missing_code)
        return f"the release has no {absent.split(':', 1)[1]}" if absent else ""

    def not_driven(self, version: str, scenario: str) -> str:
        """Why a release that has the scenario's code cannot run it ("": it can): a
        feature's code the slice builds on, or what the slice needs beside it."""
        missing = (self._first_missing(version, scenario, contract.missing_code)
                   if scenario in SHIPS else "")
        missing = missing or self._first_missing(version, scenario, contract.undriven)
        return (f"the release has the code; specrace's slice needs "
                f"{missing.replace(':', '.')}, which it lacks") if missing else ""

    def _first_missing(self, version: str, scenario: str, check) -> str:
        """The first of ``scenario``'s needs (``NEEDS``) that ``check(root, need)`` finds
        missing from ``version``'s source ("": none, or the release is not set up)."""
        root = self.line.release_root(version)
        if root is None:
            return ""
        return next((got for need in NEEDS.get(scenario, ()) if (got := check(root, need))),
                    "")


def _has(root: str, target: str) -> bool:
    """Is ``"module:qualname"`` defined in the release's source at ``root``?"""
    return static.find(root, target)[0] is not None
