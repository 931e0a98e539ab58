"""The declared stand-in for the model's layers: the toy bigram (embedding -> logits)
behind the interface upstream's runners call (``forward(input_ids, positions,
forward_batch)`` -> ``LogitsProcessorOutput``), attending through upstream's
``RadixAttention`` -- one layer, one head of the toy's hidden size -- so the KV write
(``set_kv_buffer``) and the reads of ``req_to_token`` and the KV pool are the attention
backend's, upstream's. The logits stay the bigram's (the attention output is added at
zero weight: what it read changes no token, as the toy's own attention does), so every
verdict the toy model gave is unchanged."""
from __future__ import annotations

import torch

ARCHITECTURE = "SpecraceToyForCausalLM"


class StandInCausalLM(torch.nn.Module):
    """Stands in for a ``*ForCausalLM`` of ``sglang.srt.models`` (module docstring)."""

    def __init__(self, toy) -> None:
        from sglang.srt.layers.radix_attention import RadixAttention
        super().__init__()
        self.toy = toy
        H = toy.embed.shape[1]
        self.attn = RadixAttention(num_heads=1, head_dim=H, scaling=H ** -0.5,
                                   num_kv_heads=1, layer_id=0)
        self.shared_experts_config = None  # no MoE

    def forward(self, input_ids, positions, forward_batch, **kw):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        ids = input_ids.to(torch.int64)
        hidden, logits = self.toy.forward_with_hidden(ids)
        out = self.attn(hidden, hidden, hidden, forward_batch)
        hidden = hidden + 0.0 * out  # the attention read the pool; the bigram decides
        if forward_batch.forward_mode.is_extend() and \
                not forward_batch.forward_mode.is_target_verify():
            # upstream's logits processor keeps each request's last row of a prefill
            last = torch.cumsum(forward_batch.extend_seq_lens, 0) - 1
            logits, hidden = logits[last], hidden[last]
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden)

