"""Ours, named as such: the toy models and the toy attention backend vLLM's runner drives.

The target model is specrace's toy model (``toys.model.successor``: each token's greedy
successor, a few lead to EOS), so the model oracle judges vLLM's outputs as it judges
every target's. It is a *hybrid* model (``is_hybrid``, as Qwen3-Next / Mamba2 models
declare), so the runner takes its hybrid path: after each verify it computes the accepted
counts, copies them to pinned host memory, and the next step's attention metadata hands
them back to the model. The model's one layer keeps a "recurrent state" as GDN does --
the last ``1 + drafts`` input tokens of the request, one per speculative slot -- and the
next step picks its previous token from slot ``num_accepted_tokens - 1``; it also reads
the previous token from the KV cache by position. The two agree exactly when the accepted
count the runner handed over is the true one; when they do not (a stale count), or when
the ``seq_lens`` the runner uploaded are not the request's true length, the layer's output
is garbled, as a real model's is, and the oracles see wrong tokens.

``DENSE_ARCH`` is the same model without the state (attention only): vLLM's path for a
model that is not hybrid, with no accepted counts copied at all.

The drafter is a second toy model that proposes the successor except after every third
token, so drafts are accepted in full, in part and not at all. vLLM's V1 runner drives it
as a draft model (``draft_model``) or, where the runner has no draft-model proposer
(0.13.0, 0.14.0, whose async scheduling also accepts only EAGLE / MTP), as an
EAGLE head (``EAGLE_ARCH``, config ``configs/eagle``): the same draft rule on its input
id where the target's hidden state it is handed agrees with that id, a garbled token
where it does not (a stale or misplaced hidden state shows as wrong drafts, as a real
EAGLE head's would).

Models are registered through vLLM's own ``ModelRegistry`` and built by its dummy loader;
they have no parameters (nothing for a weight loader to load).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

import torch
import torch.nn as nn

from toys.model import successor
from toys.vocab import VOCAB_SIZE

HEAD = 4  # the configs' head_dim: the KV cache's last dimension
TARGET_ARCH = "SpecraceToyHybridForCausalLM"
DENSE_ARCH = "SpecraceToyDenseForCausalLM"
DRAFT_ARCH = "SpecraceToyDraftForCausalLM"
# "Eagle..." so that vLLM's EAGLEConfig keeps the name as it wraps the config (0.13.0
# transformers_utils/configs/eagle.py:44-51 prefixes any other name with "Eagle")
EAGLE_ARCH = "EagleSpecraceToyV1DraftForCausalLM"

_TABLES: dict = {}


def _succ_table(device) -> torch.Tensor:
    """``successor`` as a lookup table on ``device`` (one per device and run)."""
    key = str(device)
    table = _TABLES.get(key)
    if table is None or table.device != torch.device(device):
        table = torch.tensor([successor(t) for t in range(VOCAB_SIZE)], dtype=torch.int64,
                             device=device)
        _TABLES[key] = table
    return table


def draft_rule(tokens: torch.Tensor) -> torch.Tensor:
    """The drafter's guess: the successor, wrong after every third token id."""
    succ = _succ_table(tokens.device)[tokens]
    return torch.where(tokens % 3 == 0, (succ + 1) % VOCAB_SIZE, succ)


def garble(tokens: torch.Tensor) -> torch.Tensor:
    """What a layer fed the wrong state answers: a token that is not the successor."""
    return (tokens + 7) % VOCAB_SIZE


def _backend_classes():
    """The toy attention backend, built against the installed vLLM's base classes
    (imported when the target loads, never at specrace's import)."""
    try:
        from vllm.v1.attention.backend import (AttentionBackend, AttentionImpl,
                                               AttentionMetadataBuilder)
    except ImportError:  # 0.13.0: the interfaces before they moved to v1/attention/
        from vllm.attention.backends.abstract import AttentionBackend, AttentionImpl
        from vllm.v1.attention.backends.utils import AttentionMetadataBuilder
    from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

    @dataclass
    class ToyMetadata:
        num_reqs: int
        num_actual_tokens: int
        query_start_loc: torch.Tensor
        seq_lens: torch.Tensor
        block_table: torch.Tensor
        slot_mapping: torch.Tensor
        num_accepted_tokens: Optional[torch.Tensor]
        num_decode_draft_tokens: Optional[torch.Tensor]

    class ToyMetadataBuilder(GDNAttentionMetadataBuilder):
        """A GDN builder by type only: the runner hands ``num_accepted_tokens`` and
        ``num_decode_draft_tokens_cpu`` to GDN / Mamba2 builders (an isinstance check in
        ``_build_attention_metadata``), exactly as it does for Qwen3-Next."""

        def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
            AttentionMetadataBuilder.__init__(self, kv_cache_spec, layer_names, vllm_config,
                                              device)
            spec = vllm_config.speculative_config
            self.num_spec = spec.num_speculative_tokens if spec else 0
            self.use_spec_decode = self.num_spec > 0
            self._init_reorder_batch_threshold(1, self.use_spec_decode)

        def build(self, common_prefix_len, common_attn_metadata, num_accepted_tokens=None,
                  num_decode_draft_tokens_cpu=None, fast_build=False):
            m = common_attn_metadata
            drafts = None
            if num_decode_draft_tokens_cpu is not None:
                drafts = num_decode_draft_tokens_cpu[: m.num_reqs].to(self.device,
                                                                     non_blocking=True)
            return ToyMetadata(
                num_reqs=m.num_reqs, num_actual_tokens=m.num_actual_tokens,
                query_start_loc=m.query_start_loc[: m.num_reqs + 1],
                seq_lens=m.seq_lens[: m.num_reqs],
                block_table=m.block_table_tensor[: m.num_reqs],
                slot_mapping=m.slot_mapping[: m.num_actual_tokens],
                num_accepted_tokens=(None if num_accepted_tokens is None
                                     else num_accepted_tokens[: m.num_reqs]),
                num_decode_draft_tokens=drafts)

        def build_for_cudagraph_capture(self, common_attn_metadata):
            return self.build(0, common_attn_metadata)

    class ToyImpl(AttentionImpl):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def forward(self, *args: Any, **kwargs: Any):  # the toy layers compute directly
            raise NotImplementedError

    class ToyBackend(AttentionBackend):
        supported_dtypes: ClassVar[list] = [torch.float32]
        supported_kv_cache_dtypes: ClassVar[list] = ["auto"]

        @staticmethod
        def get_name() -> str:
            return "SPECRACE_TOY"

        @staticmethod
        def get_impl_cls():
            return ToyImpl

        @staticmethod
        def get_builder_cls():
            return ToyMetadataBuilder

        @staticmethod
        def get_kv_cache_shape(num_blocks, block_size, num_kv_heads, head_size,
                               cache_dtype_str="auto"):
            return (2, num_blocks, block_size, num_kv_heads, head_size)

        @staticmethod
        def get_supported_kernel_block_sizes():
            return [16]

    return ToyBackend, ToyImpl


def model_classes():
    """(target class, draft class), built against the installed vLLM."""
    from vllm.forward_context import get_forward_context
    from vllm.model_executor.layers.attention_layer_base import AttentionLayerBase
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    backend, impl = _backend_classes()

    class ToyLayer(nn.Module, AttentionLayerBase):
        def __init__(self, prefix: str, vllm_config) -> None:
            super().__init__()
            self.layer_name = prefix
            self.kv_cache = [torch.tensor([])]
            self.impl = impl()
            ctx = vllm_config.compilation_config.static_forward_context
            if prefix in ctx:
                raise ValueError(f"duplicate layer {prefix}")
            ctx[prefix] = self  # registered as vLLM's Attention layers register
            self.block_size = vllm_config.cache_config.block_size

        def get_attn_backend(self):
            return backend

        def get_kv_cache_spec(self, vllm_config):
            return FullAttentionSpec(block_size=vllm_config.cache_config.block_size,
                                     num_kv_heads=1, head_size=HEAD, dtype=torch.float32)

        def cache(self) -> torch.Tensor:
            """The layer's [2, blocks, block_size, heads, head] KV cache: a one-element
            list (per virtual engine) up to 0.18.0, the tensor itself from 0.19.0."""
            kv = self.kv_cache
            return kv[0] if isinstance(kv, list) else kv

        def metadata(self):
            md = get_forward_context().attn_metadata
            return md.get(self.layer_name) if isinstance(md, dict) else None

        def write_k(self, ids: torch.Tensor, md) -> None:
            """K[slot] = the token (the KV write); padding slots (-1) go to slot 0, in
            vLLM's null block."""
            k = self.cache()[0].view(-1, HEAD)
            n = md.num_actual_tokens
            slots = md.slot_mapping[:n].to(torch.int64)
            slots = torch.where(slots >= 0, slots, torch.zeros_like(slots))
            k.select(1, 0).scatter_(0, slots, ids[:n].to(k.dtype))

    class ToyHybridLayer(ToyLayer):
        uses_state = True  # the dense model's layer reads the KV cache alone

        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            md = self.metadata()
            succ = _succ_table(input_ids.device)
            if md is None or self.cache().numel() == 0:  # a dummy run
                return succ[input_ids.to(torch.int64)]
            n_in, n, reqs, bs = input_ids.shape[0], md.num_actual_tokens, md.num_reqs, \
                self.block_size
            dev = input_ids.device
            ids = input_ids[:n].to(torch.int64)
            pos = positions[:n].to(torch.int64)
            qsl = md.query_start_loc.to(torch.int64)
            tok = torch.arange(n, device=dev)
            req = torch.bucketize(tok, qsl[1:], right=True).clamp(max=reqs - 1)
            first = tok == qsl[req]
            bt = md.block_table.to(torch.int64)
            kc = self.cache()[0].reshape(-1, bs, HEAD)
            vc = self.cache()[1].reshape(-1, bs, HEAD)
            # the previous token as the state holds it: slot num_accepted - 1 of the
            # request's state (V of its first block), as GDN picks its spec state
            acc = (md.num_accepted_tokens.to(torch.int64)[req]
                   if md.num_accepted_tokens is not None else torch.ones_like(req))
            from_state = vc[bt[req, 0], (acc - 1).clamp(0, bs - 1), 0].to(torch.int64)
            # ... and as the KV cache holds it, by position
            before = (pos - 1).clamp(min=0)
            from_kv = kc[bt[req, before // bs], before % bs, 0].to(torch.int64)
            uses_state = first & (pos > 0) & self.uses_state
            stale_state = uses_state & (from_state != from_kv)
            # the request's length as the runner uploaded it, against its true length
            last = qsl[1:] - 1
            true_len = pos[last.clamp(0, n - 1)] + 1
            wrong_len = (md.seq_lens.to(torch.int64)[: reqs] != true_len)[req]
            out = succ[ids]
            out = torch.where(stale_state | wrong_len, garble(out), out)
            self.write_k(ids, md)
            self._keep_state(ids, md, qsl, n, vc)
            if n_in > n:
                out = torch.cat([out, out.new_zeros(n_in - n)])
            return out

        def _keep_state(self, ids, md, qsl, n, vc) -> None:
            """state[j] = the input token at query index q_len - 1 - d + j, j = 0..d
            (d: the request's drafts in this step): what the next step picks from."""
            bs = self.block_size
            qlen = qsl[1:] - qsl[:-1]
            d = (md.num_decode_draft_tokens.to(torch.int64).clamp(min=0)
                 if md.num_decode_draft_tokens is not None else torch.zeros_like(qlen))
            j = torch.arange(bs, device=ids.device)[None, :]
            src = (qsl[:-1, None] + qlen[:, None] - 1 - d[:, None] + j).clamp(0, n - 1)
            dst = md.block_table.to(torch.int64)[:, 0][:, None] * bs + j
            dst = torch.where(j <= d[:, None], dst, torch.zeros_like(dst))  # null block
            vc.reshape(-1, HEAD).select(1, 0).scatter_(0, dst.reshape(-1),
                                                       ids[src].reshape(-1).to(vc.dtype))

    class ToyDraftLayer(ToyLayer):
        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            md = self.metadata()
            if md is not None and self.cache().numel() > 0:
                self.write_k(input_ids.to(torch.int64), md)
            return draft_rule(input_ids.to(torch.int64))

    class ToyLM(nn.Module):
        layer_cls: type = ToyLayer
        layer_index = 0

        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            super().__init__()
            base = f"{prefix}." if prefix else ""
            self.attn = self.layer_cls(f"{base}model.layers.{self.layer_index}.attn",
                                       vllm_config)
            self.config = vllm_config.model_config.hf_config

        def embed_input_ids(self, input_ids, *args: Any, **kwargs: Any):
            return torch.nn.functional.one_hot(input_ids.long(), VOCAB_SIZE).float()

        def forward(self, input_ids=None, positions=None, intermediate_tensors=None,
                    inputs_embeds=None, **kwargs: Any):
            # "hidden states" are the next token, one-hot: the logits are exact
            return torch.nn.functional.one_hot(self.attn(input_ids, positions).long(),
                                               VOCAB_SIZE).to(torch.float32)

        def compute_logits(self, hidden_states):
            return hidden_states

        def load_weights(self, weights):
            return set()

    class TargetLM(ToyLM):
        """A target model: EAGLE's ``load_model`` shares the target's input embedding
        with its head (``target.model.embed_tokens``, 0.13.0 ``spec_decode/eagle.py:
        1040-1047``; an AttributeError without one). The toy's embedding is a one-hot with
        no weight, so it has an empty one to hand over; the draft-model proposer shares
        nothing (0.17.0 ``spec_decode/draft_model.py:67-75``)."""

        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            super().__init__(vllm_config=vllm_config, prefix=prefix)
            self.model = nn.Module()
            self.model.embed_tokens = nn.Module()

    class Target(TargetLM):
        layer_cls = ToyHybridLayer
        is_hybrid: ClassVar = True  # vLLM's IsHybrid interface, read by ModelConfig

        @classmethod
        def get_mamba_state_shape_from_config(cls, vllm_config):
            return ((1, 2),)

        @classmethod
        def get_mamba_state_dtype_from_config(cls, vllm_config):
            return (torch.float32,)

        @classmethod
        def get_mamba_state_copy_func(cls):
            return ()

    class DenseLayer(ToyHybridLayer):
        uses_state = False

    class Dense(TargetLM):
        layer_cls = DenseLayer

    class Draft(ToyLM):
        layer_cls = ToyDraftLayer
        # a layer index of its own: bind_kv_cache refuses two KV layers on one index
        # on a platform it does not know
        layer_index = 1

    Target.__name__ = Target.__qualname__ = TARGET_ARCH
    Dense.__name__ = Dense.__qualname__ = DENSE_ARCH
    Draft.__name__ = Draft.__qualname__ = DRAFT_ARCH
    return Target, Dense, Draft


def eagle_class(draft, layer_cls=None, arch: str = EAGLE_ARCH):
    """The toy drafter as V1's ``EagleProposer`` calls an EAGLE head --
    ``model(input_ids=, positions=, hidden_states=, inputs_embeds=)`` returning
    ``(last_hidden_states, hidden_states)`` (0.13.0 ``spec_decode/eagle.py:313-322``) --
    on the draft model's one attention layer (its KV writes are the drafter's);
    ``layer_cls`` and ``arch``: that layer's class and the head's architecture name where
    a runner has its own (Model Runner V2's)."""

    class ToyEagle(draft):
        def __init__(self, *, vllm_config, prefix: str = "") -> None:
            draft.__init__(self, vllm_config=vllm_config, prefix=prefix)
            # the head's inner module, where EagleProposer.load_model puts the target's
            # embedding (the head has no ``has_own_embed_tokens``: it shares, as an MTP
            # head does; nothing of it is read -- the embedding is a one-hot)
            self.model = nn.Module()

        def forward(self, input_ids=None, positions=None, hidden_states=None,
                    inputs_embeds=None, **kwargs: Any):
            ids = input_ids.to(torch.int64)
            proposed = self.attn(input_ids, positions)  # KV write + draft_rule(ids)
            if hidden_states is not None:
                # the target's hidden state at a slot is the one-hot of the token it
                # predicts there, which is EAGLE's input id wherever the head samples
                agrees = hidden_states[: ids.shape[0]].argmax(dim=-1) == ids
                proposed = torch.where(agrees, proposed, garble(proposed))
            out = torch.nn.functional.one_hot(proposed.long(), VOCAB_SIZE).to(torch.float32)
            return out, out

    ToyEagle.__name__ = ToyEagle.__qualname__ = arch
    if layer_cls is not None:
        ToyEagle.layer_cls = layer_cls
    return ToyEagle


def register() -> None:
    """The toy models into vLLM's own registry (``load_format="dummy"`` builds them)."""
    from vllm import ModelRegistry
    target, dense, draft = model_classes()
    ModelRegistry.register_model(TARGET_ARCH, target)
    ModelRegistry.register_model(DENSE_ARCH, dense)
    ModelRegistry.register_model(DRAFT_ARCH, draft)
    ModelRegistry.register_model(EAGLE_ARCH, eagle_class(draft))
