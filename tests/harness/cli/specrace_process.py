"""Moved to ``tests/specrace/specrace_process.py`` (the CLI tests are in tests/specrace/).
Kept here only for ``tests/upstream/test_audit_ci.py``, which imports
``tests.harness.cli.specrace_process`` and moves with the sglang tests: that import goes to
``tests.specrace.specrace_process`` then, and this file with it."""
from tests.specrace.specrace_process import pytest_plugin_args  # noqa: F401
