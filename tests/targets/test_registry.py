"""The registry is keyed by the vocabulary's ``TargetName``: every name has a target that
declares itself under that name (without importing the server it drives), and a name
outside the vocabulary is a ``TargetError`` naming the choices."""
from __future__ import annotations

import pytest

import targets
from seams.vocab import TargetName


@pytest.mark.parametrize("name", list(TargetName))
def test_every_target_name_declares_its_target(name):
    assert targets.declared(str(name)).name == name
    assert set(targets._REGISTRY) == set(TargetName)


def test_an_unknown_name_is_refused_with_the_choices():
    with pytest.raises(targets.TargetError, match="unknown target 'vlm'; expected one of: "
                                                  "impl, sglang, vllm"):
        targets.declared("vlm")
