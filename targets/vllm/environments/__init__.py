"""The vLLM target's release environments: one venv per release with its own pins
(``targets.envs``; only the wheel's Python files are unpacked), and which scenarios a
release's code can run -- read from its source, never imported here."""
from __future__ import annotations

import os

from seams.paths import REPO_ROOT
from targets.envs import LineEnvironments, ReleaseLine
from targets.vllm.boundary import contract

LINE = ReleaseLine(package="vllm", supported=contract.SUPPORTED,
                   requirements=os.path.join(REPO_ROOT, "requirements-vllm.txt"),
                   locks=os.path.join(os.path.dirname(os.path.abspath(__file__)), "locks"),
                   make_var="VLLM", python_only=True)


class VllmEnvironments(LineEnvironments):
    line = LINE

    def not_applicable(self, version: str, scenario: str) -> str:
        root = self.line.release_root(version)
        if root is None:
            return ""
        return contract.not_applicable(root, scenario)

    def not_driven(self, version: str, scenario: str) -> str:
        """The release has the scenario's code, but the contract refuses what the target
        would have to call or stand in for there (0.33.0's V1 runner, 0.16.0's Model
        Runner V2 kernels): the first problem of the code the scenario drives, read from
        source."""
        root = self.line.release_root(version)
        if root is None or contract.not_applicable(root, scenario):
            return ""
        problems = contract.scenario_problems(contract.evaluate(version, root), scenario)
        if not problems:
            return ""
        more = len(problems) - 1
        return (f"the release has the code; specrace's vLLM target cannot drive it yet: "
                f"{problems[0]}" + (f" (+{more} more)" if more > 0 else ""))
