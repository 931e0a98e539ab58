"""The arguments of ``specrace census`` and ``specrace coverage`` (``specrace.parser``
adds them; ``specrace.census_cmd`` runs them)."""
from __future__ import annotations

import argparse
import re

from specrace import cli_args as A

CENSUS_TARGETS = ("sglang", "vllm")
_VERSION = re.compile(r"^\d+(\.\d+){1,3}([a-z0-9.+-]*)$")


def _release(text: str) -> str:
    if not _VERSION.match(text or ""):
        raise argparse.ArgumentTypeError(f"not a release version: {A._echo(text)}")
    return text


def add_parsers(sub) -> None:
    c = sub.add_parser("census", help="every cross-stream and host/device ordering site in "
                                      "an upstream server's serving code (static)")
    c.add_argument("--target", choices=CENSUS_TARGETS, default="sglang")
    c.add_argument("--release", type=_release, default=None,
                   help="a release set up under .releases/ (default: the one installed here)")
    c.add_argument("--readbacks", action="store_true",
                   help="also list .item() / .tolist() / .cpu() readbacks (sync-readback)")
    c.add_argument("--summary", action="store_true", help="counts only, no site list")
    c.add_argument("--json", action="store_true")
    v = sub.add_parser("coverage", help="which census sites the scenarios run, and why the "
                                        "rest do not (coverage.py over the release's code)")
    v.add_argument("scenarios", nargs="*", metavar="SCENARIO[:VARIANT]",
                   help="default: every shipped configuration of every scenario that "
                        "applies to the release (vLLM: its coverage set)")
    v.add_argument("--target", choices=CENSUS_TARGETS, default="sglang")
    v.add_argument("--release", type=_release, default=None,
                   help="a release set up under .releases/ (default: the one installed here)")
    v.add_argument("--backend", choices=["sim", "cuda", "auto"], default="sim")
    v.add_argument("--trials", type=A.trials, default=1)
    v.add_argument("--jobs", type=A.int_in(1, 256), default=None,
                   help="scenarios run side by side, each its own child (default: one per "
                        "core on the simulator, one at a time otherwise)")
    v.add_argument("--summary", action="store_true", help="no list of the sites not run")
    v.add_argument("--json", action="store_true")
