"""Ours, named as such: the toy EAGLE drafter Model Runner V2's speculator drives.

MRv2's speculator (0.17.0 ``spec_decode/eagle/speculator.py``) is EAGLE-only: it loads
the draft model with ``load_eagle_model`` and calls it as an EAGLE head --
``model(input_ids=, positions=, hidden_states=)`` returning ``(last_hidden_states,
hidden_states)`` -- where ``hidden_states`` are the target's (the first pass, one slot
per target token) or its own previous output (each later draft step).

The toy target's "hidden state" at a slot is the one-hot of the token it predicts there
(``engine/model.py``), and EAGLE's input id at a slot is the token after it, so wherever
the drafter samples (a request's last accepted slot) and at every decode step, the two
name the same token. The drafter takes both: it proposes ``draft_rule`` of the input id
(the toy draft model's guess: the successor, wrong after every third token id, so
drafts are accepted in full, in part and not at all) where the hidden state agrees with
it, and a garbled token where it does not -- so a stale or misplaced hidden state the
runner hands over shows as wrong drafts, as a real EAGLE head's do. (Drafts only steer
acceptance: the target's verification keeps the output greedy either way.) Its output
hidden state is the one-hot of its proposal, the feature the next draft step reads.

The config (``configs/eagle``) names the architecture ``Eagle...`` so that vLLM's
``EAGLEConfig`` keeps the name as it wraps the config; the class is registered through
vLLM's ``ModelRegistry`` like the other toy models and built by its dummy loader.
"""
from __future__ import annotations

import os
from typing import Any

import torch

from impl.vocab import VOCAB_SIZE

EAGLE_ARCH = "EagleSpecraceToyDraftForCausalLM"
CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "eagle")


def eagle_class():
    """The toy EAGLE head, built on the toy draft model (its one attention layer writes
    the draft's KV as the V1 path's drafter does)."""
    from targets.vllm.engine.model import garble, model_classes
    _target, _dense, draft = model_classes()

    class ToyEagle(draft):
        def forward(self, input_ids=None, positions=None, hidden_states=None,
                    inputs_embeds=None, **kwargs: Any):
            ids = input_ids.to(torch.int64)
            proposed = self.attn(input_ids, positions)  # KV write + draft_rule(ids)
            if hidden_states is not None:
                agrees = hidden_states[: ids.shape[0]].argmax(dim=-1) == ids
                proposed = torch.where(agrees, proposed, garble(proposed))
            out = torch.nn.functional.one_hot(proposed.long(), VOCAB_SIZE).to(torch.float32)
            return out, out

    ToyEagle.__name__ = ToyEagle.__qualname__ = EAGLE_ARCH
    return ToyEagle


def register() -> None:
    """The toy EAGLE head into vLLM's own registry."""
    from vllm import ModelRegistry
    ModelRegistry.register_model(EAGLE_ARCH, eagle_class())
