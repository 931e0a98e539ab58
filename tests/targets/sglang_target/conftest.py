"""Tests of the sglang target: they need the installed package (``make upstream``) and
are skipped, with that reason, where it is absent."""
import importlib.metadata

import pytest


def _installed() -> bool:
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pytest_collection_modifyitems(config, items):
    if _installed():
        return
    skip = pytest.mark.skip(reason="sglang is not installed (make upstream)")
    for item in items:
        if "tests/targets/sglang_target/" in item.nodeid:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def sglang():
    """The sglang target, loaded: once per module that asks (``pytestmark =
    pytest.mark.usefixtures("sglang")`` where every test needs it)."""
    import targets
    return targets.get("sglang")
