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

0.34.0's ``load_eagle_model`` reads each model's inner module (``model.model``) to share
the target's embedding and head: the toy models have neither (their "embedding" is a
one-hot), so each gets an empty inner module -- the EAGLE head here, and the dense
target as Model Runner V2 runs it (``target_class``, ``configs/target``: the dense toy
model of ``engine/model.py`` under a name of its own, so the V1 path's is unchanged).

The config (``configs/eagle``) names the architecture ``Eagle...`` so that vLLM's
``EAGLEConfig`` keeps the name as it wraps the config; the class is registered through
vLLM's ``ModelRegistry`` like the other toy models and built by its dummy loader.
"""
from __future__ import annotations

import os

import torch

EAGLE_ARCH = "EagleSpecraceToyDraftForCausalLM"
TARGET_ARCH = "SpecraceToyDenseV2ForCausalLM"
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs")
CONFIG = os.path.join(CONFIGS, "eagle")
TARGET_CONFIG = os.path.join(CONFIGS, "target")


def _layer(layer_cls):
    """``layer_cls`` whose backend answers the installed release's interface
    (``backend.backend_for``)."""
    from targets.vllm.mrv2.backend import backend_for

    class Layer(layer_cls):
        def get_attn_backend(self):
            return backend_for(layer_cls.get_attn_backend(self))

        def cache(self) -> torch.Tensor:
            """The layer's KV cache as the toy layers index it, [2, blocks, block_size,
            heads, head]: 0.34.0 binds each layer a [blocks, heads, block_size, K and V
            channels] view, seen here as K = channels [0, head), V = [head, 2 head)."""
            kv = layer_cls.cache(self)
            if kv.dim() != 4:
                return kv
            blocks, heads, size, channels = kv.shape
            if heads != 1:
                raise NotImplementedError("the toy layers have one KV head")
            return kv.view(blocks, size, 2, channels // 2).permute(2, 0, 1, 3).unsqueeze(3)

    Layer.__name__ = Layer.__qualname__ = layer_cls.__name__
    return Layer


def eagle_class():
    """The V1 path's toy EAGLE head (``engine.model.eagle_class``) on this runner's
    layer: the draft model's one attention layer writes the draft's KV as V1's does."""
    from targets.vllm.engine import model
    _target, _dense, draft = model.model_classes()
    return model.eagle_class(draft, _layer(draft.layer_cls), EAGLE_ARCH)


def target_class():
    """The dense toy target with an (empty) inner module, as MRv2's loaders read it."""
    from targets.vllm.engine.model import model_classes
    _target, dense, _draft = model_classes()

    class ToyTarget(dense):
        layer_cls = _layer(dense.layer_cls)

        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            dense.__init__(self, vllm_config=vllm_config, prefix=prefix)
            self.model = torch.nn.Module()  # no embedding or head to share

    ToyTarget.__name__ = ToyTarget.__qualname__ = TARGET_ARCH
    return ToyTarget


def register() -> None:
    """The toy EAGLE head and MRv2's target into vLLM's own registry."""
    from vllm import ModelRegistry
    ModelRegistry.register_model(EAGLE_ARCH, eagle_class())
    ModelRegistry.register_model(TARGET_ARCH, target_class())
