"""``--target vllm`` from an interpreter without vLLM: the message names the releases set
up here and the interpreter to run, instead of asking for a set-up that is already done."""
from __future__ import annotations

import importlib.util

import pytest

import targets.vllm as vllm_target
from harness.target import TargetError
from targets.vllm.environments import LINE

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is not None,
                                reason="vLLM is installed in this interpreter")


def _message(monkeypatch, ready):
    monkeypatch.setattr(type(LINE), "installed", lambda self: list(ready))  # frozen: the class
    with pytest.raises(TargetError) as exc:
        vllm_target.VllmTarget().load()
    return str(exc.value)


def test_with_releases_set_up_it_names_them_and_the_interpreter(monkeypatch):
    text = _message(monkeypatch, ["0.17.0", "0.27.1"])
    assert "set up here: 0.17.0, 0.27.1" in text
    assert ".releases/vllm/0.27.1/bin/python -m specrace.cli" in text
    assert "make upstream" not in text


def test_with_none_set_up_it_says_how_to_set_one_up(monkeypatch):
    text = _message(monkeypatch, [])
    assert "make upstream TARGET=vllm VLLM=0.17.0" in text
