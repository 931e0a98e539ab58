"""The target interface: what a server under test gives the engine.

``harness`` drives *objects* of this interface and never looks a target up by name (the
registry, ``targets.get``, sits a floor above). Two servers implement it: specrace's own
mirror (``targets.ImplTarget``) and installed upstream sglang (``targets.sglang``); a
second upstream server plugs in through the same methods.

A target supplies

* its server arguments: ``args_type``, a dataclass extending the toy world's
  ``toys.server_args.ServerArgs`` with the target's own fields (``server_args`` makes one);
* the engine: ``scheduler(args, device, grammar_backend)``, a ``toys.engine.Engine``
  (``step`` / ``has_work`` / ``run_to_completion(limit)`` / ``add_request`` / ``close`` /
  ``iteration`` and ``streams``: name -> stream, labelled in traces);
* its request type (``request``) and grammar backend (``grammar_backend``);
* the run-time patches a set of server args needs (``variant``), and why a variant or a
  source patch cannot run on the installed code (``variant_problem``, ``patch_problem``);
* its own defaults: the variant a run gets when none is asked for, and the fence;
* a description for reports (``describe``: version, tier, digest of the files driven);
* its seeded bugs (``mutations``: the mutation matrix's catalogue) and the candidate fixes
  of upstream findings (``fixes``), each a run-time source patch;
* for an upstream server, its release environments (``environments``: one environment per
  release with that release's own pins, for ``specrace releases``).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, ContextManager, Dict, Iterator, List, Optional, Tuple, Type, Union

from mutations.base import Mutation
from seams.sourcepatch import FirstFitting, PatchSet, SourcePatch
from toys.engine import Engine
from toys.server_args import ServerArgs


class TargetError(ValueError):
    """The target cannot run here (not installed, unsupported version): bad input.
    ``problems``: every reason, each shown on a line of its own."""

    def __init__(self, message: str, problems=()) -> None:
        super().__init__(message)
        self.problems = list(problems)


class DoesNotFit(TargetError):
    """The code under test crashed in its synchronous reference run: whatever the
    contract proved, the target cannot drive this code, so no run of it is a verdict."""


class Target:
    name = "target"
    summary = ""
    # scenario names this target runs (None: every scenario)
    scenarios: Optional[Tuple[str, ...]] = None
    # the hardware platforms the code under test can be read as running on (--platform)
    platforms: Tuple[str, ...] = ("cuda",)
    # the server arguments this target's engine reads: the toy world's and its own
    args_type: Type[ServerArgs] = ServerArgs

    def server_args(self, **fields: Any) -> ServerArgs:
        """This target's server args with ``fields`` set; a field of another target's
        (``hybrid`` on sglang, ``eagle_topk`` on vLLM) is bad input, named."""
        known = {f.name for f in dataclasses.fields(self.args_type)}
        foreign = sorted(set(fields) - known)
        if foreign:
            raise TargetError(f"server arg {foreign[0]!r} is not one of the {self.name} "
                              f"target's ({self.args_type.__name__})")
        return self.args_type(**fields)

    def load(self) -> None:
        """Import and check the code under test (raises ``TargetError``)."""

    def scheduler(self, args, device, grammar_backend: Any = None) -> Engine:
        raise NotImplementedError

    def request(self, rid: int, prompt, max_new_tokens: int, grammar: Any = None):
        raise NotImplementedError

    def grammar_backend(self):
        raise TargetError(f"the {self.name} target has no grammar backend")

    @contextlib.contextmanager
    def variant(self, args, device) -> Iterator[None]:
        """Run-time patches a run with these server args on ``device`` needs (none by
        default)."""
        yield

    def describe(self) -> Dict[str, Any]:
        return {"target": self.name}

    def watching(self) -> ContextManager[None]:
        """Around the first trial of a run: what the target wants to learn from code that
        really ran (the sglang target: which of the package's files executed, each checked
        against the wheel). The default watches nothing."""
        return contextlib.nullcontext()

    def installed_version(self) -> Optional[str]:
        """The version of the code under test this interpreter would import, read
        without importing it (None: one version only, the tree's own)."""
        return None

    def label(self) -> str:
        """The code under test in one phrase, for messages ("sglang 0.5.23")."""
        return self.name

    def patch_problem(self, target: str, edits) -> str:
        """Why a source patch of ``target`` cannot be applied to this code ("" if it fits).
        On our own tree a patch that does not fit is a harness error (``PatchError``, raised
        when it is applied), so nothing is disabled here."""
        return ""

    def variant_problem(self, variant) -> str:
        """Why ``variant`` (a ``harness.run.Variant``) cannot run on this code ("": it
        can)."""
        return ""

    def default_variant(self, scenario) -> str:
        """The variant a run of ``scenario`` gets when none is asked for."""
        return scenario.default_variant

    def default_war_barrier(self) -> str:
        """The fence a run gets when none is asked for: the code's own."""
        return "fine"

    def supports(self, scenario: str) -> bool:
        return self.scenarios is None or scenario in self.scenarios

    def unsupported(self, scenario: str) -> str:
        """Why ``scenario`` does not run here (for the one-line error): which scenarios
        do, and the installed code's reason where the target knows one."""
        runs = [s for s in (self.scenarios or ()) if self.supports(s)]
        return f"it runs: {', '.join(runs) or 'none here'}"

    def mutations(self) -> List[Mutation]:
        """The seeded bugs of this target's code (the mutation matrix's rows)."""
        return []

    def fixes(self) -> Dict[str, Union[SourcePatch, PatchSet, FirstFitting]]:
        """Candidate fixes of upstream findings, by name (none for our own code)."""
        return {}

    def mutation(self, name: str) -> Mutation:
        found = {m.name: m for m in self.mutations()}.get(name)
        if found is None:
            raise KeyError(f"no mutation {name!r} for the {self.name} target")
        return found

    def fix(self, name: str) -> Union[SourcePatch, PatchSet, FirstFitting]:
        fixes = self.fixes()
        if name not in fixes:
            raise KeyError(f"no fix {name!r} for the {self.name} target; known: "
                           f"{', '.join(sorted(fixes)) or 'none'}")
        return fixes[name]

    def environments(self) -> Optional["Environments"]:
        """The release environments of an upstream server (None: this target has one
        version, the code in the tree)."""
        return None


class Environments:
    """A target's release environments: each release of the upstream server in a venv of
    its own, with its own pins, driven in a child process (``specrace releases``).
    Reading them never imports the server in this process."""

    def chosen(self, asked: List[str]) -> List[str]:
        """The releases ``--release`` names (all set up when ``asked`` is empty), checked:
        ``ValueError`` naming a release that is not set up or not a version."""
        raise NotImplementedError

    def python(self, version: str) -> str:
        """The interpreter of ``version``'s environment."""
        raise NotImplementedError

    def skipped(self) -> List[Tuple[str, str]]:
        """Folders where environments live that are not one, each with why (a stray
        folder is named and passed over, never fatal)."""
        return []

    def not_applicable(self, version: str, scenario: str) -> str:
        """Why ``scenario`` does not apply to ``version`` -- the code it drives is absent
        from that release, read from its source -- or "" when it applies."""
        return ""

    def not_driven(self, version: str, scenario: str) -> str:
        """Why specrace cannot drive ``scenario`` on ``version`` although the release has
        its code (a slice that needs an API the release lacks), or "" when it can."""
        return ""
