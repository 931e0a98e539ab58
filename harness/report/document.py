"""A report set's JSON document, typed: the run's ``ReproResult`` and what the set adds.

``to_json`` writes ``NAME.json`` (the result's keys, the format version, the environment,
the replay command, the set's files, the shown trace's digest, the run id);
``from_json`` reads one back after ``load.load_report`` has validated it against
``schema.REPORT_SCHEMA``. No other code knows the document's keys.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from harness.trials.results import ReproResult

REPORT_FORMAT = 1


@dataclass(frozen=True)
class Report:
    result: ReproResult
    environment: Dict[str, Any] = field(default_factory=dict)
    replay_command: Optional[str] = None  # ``specrace replay NAME.json``
    report_files: Dict[str, Optional[str]] = field(default_factory=dict)  # kind -> file name
    trace_digest: Optional[str] = None  # sha256 of the shown trial's Chrome trace
    run_id: Optional[str] = None  # a digest of the rest of the document (every file has it)

    def to_json(self) -> Dict[str, Any]:
        doc: Dict[str, Any] = {"specrace_report": REPORT_FORMAT}
        doc.update({k: v for k, v in self.result.to_json().items() if k != "report_files"})
        doc["environment"] = dict(self.environment)
        doc["replay"] = {"command": self.replay_command}
        doc["report_files"] = dict(self.report_files)
        if self.trace_digest is not None:
            doc["trace_digest"] = self.trace_digest
        if self.run_id is not None:
            doc["run_id"] = self.run_id
        return doc

    @classmethod
    def from_json(cls, doc: Dict[str, Any]) -> "Report":
        replay = doc.get("replay") or {}
        return cls(ReproResult.from_json(doc), dict(doc.get("environment") or {}),
                   replay.get("command"), dict(doc.get("report_files") or {}),
                   doc.get("trace_digest"), doc.get("run_id"))


def content_id(doc: Dict[str, Any]) -> str:
    """A report's run id: a digest of its document without the ``run_id`` key (the same
    run, the same id; ``load`` recomputes it, so an edited report is told apart)."""
    rest = {k: v for k, v in doc.items() if k != "run_id"}
    text = json.dumps(rest, sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
