"""Suite-wide setup: the specrace pytest plugin and the Hypothesis profiles.

The example database is explicit: ``.hypothesis/examples`` under the project root (the
same directory the plugin's soak items use), not wherever pytest was started -- so every
xdist worker on this host reads and writes the one database, and a failing example one
worker saved is replayed by the next run of that test on any worker. The CI profile has
none: it is derandomized (Hypothesis: derandomize implies no database).

The plugin (``specrace/pytest_plugin.py``) is registered by the ``pytest11`` entry point when
the project is pip-installed; pytest loads entry-point plugins before any conftest, so it is
already imported here in that case. From a plain source tree it is not, and we register it
ourselves -- never both (pluggy refuses one module under two names).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hypothesis import settings
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import InvalidArgument

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    try:
        import harness  # noqa: F401  (installed, or already on the path)
    except ImportError:
        sys.path.insert(0, str(_ROOT))

if "specrace.pytest_plugin" not in sys.modules:  # not loaded by entry point or -p
    pytest_plugins = ["specrace.pytest_plugin"]


def _ci_parent():
    try:
        return settings.get_profile("ci")  # Hypothesis' own CI profile, where it has one
    except InvalidArgument:
        return settings.get_profile("default")


settings.register_profile("ci", parent=_ci_parent(), derandomize=True, deadline=None,
                          database=None, print_blob=True)
settings.register_profile("dev", deadline=None, database=DirectoryBasedExampleDatabase(
    str(_ROOT / ".hypothesis" / "examples")))
_ON_CI = os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")
settings.load_profile("ci" if _ON_CI else "dev")


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "long: tens of seconds or more on the 2-core CI box: "
                                       "collected first (tests/conftest.py)")


def pytest_collection_modifyitems(items) -> None:
    """The tests marked ``long`` first. Under xdist a worker takes its tests in collection
    order; a long test collected last runs alone at the end while the other workers idle
    (the sglang state machine's 300 s did, on the 2-core CI box: a third of the suite's
    wall time). First, they run beside the short ones. A stable sort: the rest keep
    their order."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)
