"""The EVS rope slice: the audit's S2 (reports/upstream/vllm-0.34.0-audit.md) driven on the
simulator with upstream's own code -- two pool writes of ``RopeState.prefill_delta`` in one
step of Model Runner V2, the second landing in the pinned slot the previous step's rope
kernel reads.

Upstream's, unmodified (0.34.0 lines; 0.33.0 the same but ``default.py`` +1; 0.27.1 names
``prepare_inputs_embeds`` ``get_mm_embeddings``, ``default.py:67-95``):

* ``RopeState`` (``vllm/v1/worker/gpu/mm/rope.py``), built by ``get_rope_state``; its
  ``prefill_delta`` a ``UvaBackedTensor`` over a 2-deep ``UvaBufferPool`` of pinned
  buffers (``buffer_utils.py:89-166``), its ``prefill_positions`` a ``StagedWriteTensor``;
* ``DefaultModelState``'s ``add_request``, ``apply_staged_writes``,
  ``prepare_inputs_embeds`` and ``prepare_inputs`` (``model_states/default.py:65-156``) on
  an instance made with ``object.__new__`` and the attributes they read;
* ``MultiModalPruner`` built by ``maybe_create_mm_pruner`` (``model_states/mm_pruning.py``),
  ``RequestState`` (``states.py``), ``EncoderCache`` and ``EncoderRunner`` (``mm/``), and
  ``vllm/multimodal/video_prune/evs.py`` (``compute_retention_mask``,
  ``compute_mrope_for_media``, ``recompute_mrope_positions``).

Ours, named so: the step loop (``Slice.step``: the order of ``GPUModelRunner.execute_model``
-- ``finish_requests``/``free_states``, ``add_requests`` with one ``apply_staged_writes``,
``prepare_inputs_embeds``, ``prepare_inputs``; 0.34.0 ``model_runner.py:1284-1338,
2073-2086``), the input batch (a namespace of the fields upstream reads), the post-step
update of ``num_computed_tokens`` (MRv2's post-update kernel), the step's "forward" (a
copy of the positions it was given), the encoder's output (computed on the host by evs's
own functions, uploaded in the step; the encoder itself is not driven), the toy models,
and a torch stand-in for ``_prepare_rope_positions_kernel`` (a Triton kernel, listed in
``targets/vllm/mrv2/table.py`` as not driven), bound only inside ``rope_kernel_bound``.

Two toy pruning models: ``QwenLikePruner`` recomputes as Qwen2.5-VL does
(``qwen2_5_vl.py:1652-1712``: strip the 4 trailing position channels, call
``evs.recompute_mrope_positions`` on the device tensors); ``SyncFreePruner`` computes the
same values from host copies it kept and uploads them asynchronously -- a recompute that
reads nothing back from the device.

Not driven here: the prompt-embeds pools (audit row B6: ``PromptEmbedsState``'s three
``UvaBackedTensor``s, rewritten by the same second ``apply_staged_writes`` call, so behind
the same recompute) and the ``NonUvaBuffer`` fallback (row B10).
"""
from __future__ import annotations

import contextlib
import inspect
import types
from typing import Dict, Iterator, List, Optional

import numpy as np
import torch

from targets.vllm.engine.kernels import GridKernel, _masked_store

ROPE = "vllm.v1.worker.gpu.mm.rope"
KERNEL = "_prepare_rope_positions_kernel"
VISION_START, IMAGE, VIDEO, VISION_END = 90, 91, 92, 93
HIDDEN = 8  # the cleaned embedding width (inputs_embeds_size)
MAX_REQS, MAX_TOKENS, MAX_LEN = 4, 32, 16


# --- the rope kernel's stand-in --------------------------------------------------------

def prepare_rope_positions(grid, positions_ptr, positions_stride, prefill_positions_ptr,
                           prefill_positions_stride0, prefill_positions_stride1,
                           prefill_delta_ptr, idx_mapping_ptr, query_start_loc_ptr,
                           prefill_lens_ptr, num_computed_tokens_ptr, BLOCK_SIZE=1024,
                           NUM_DIMS=3):
    """``_prepare_rope_positions_kernel`` (rope.py:144-192), vectorised over the grid and
    reading nothing back: each token slot of a request row gets its staged prefill
    position (prefilling) or ``num_computed + i + delta`` (decoding); ``delta`` is loaded
    for every row (rope.py:170) from the pool slot's UVA view."""
    reqs, slots = grid[0], positions_stride
    q = query_start_loc_ptr[: reqs + 1].to(torch.int64)
    t = torch.arange(slots, device=q.device)
    row = torch.bucketize(t, q[1:], right=True).clamp(max=max(reqs - 1, 0))
    valid = (t >= q[0]) & (t < q[reqs])
    r = idx_mapping_ptr[:reqs].to(torch.int64)[row]
    done = num_computed_tokens_ptr[r].to(torch.int64)
    is_prefill = done < prefill_lens_ptr[r].to(torch.int64)
    delta = prefill_delta_ptr[r].to(torch.int64)
    orig = done + (t - q[row])
    src = prefill_positions_ptr.reshape(-1)
    out = positions_ptr.reshape(-1)
    for j in range(NUM_DIMS):
        at = r * prefill_positions_stride0 + j * prefill_positions_stride1 + orig
        at = torch.where(is_prefill & valid, at, torch.zeros_like(at))
        pos = torch.where(is_prefill, src[at.clamp(0, src.numel() - 1)].to(torch.int64),
                          orig + delta)
        _masked_store(out, j * positions_stride + t, pos, valid)


def kernel_params() -> tuple:
    """The installed kernel's parameter names (table.kernel_params' reading)."""
    import importlib
    from targets.vllm.mrv2.table import kernel_params as params
    return params(getattr(importlib.import_module(ROPE), KERNEL))


@contextlib.contextmanager
def rope_kernel_bound() -> Iterator[None]:
    """The stand-in bound under the kernel's module-level name for the block (the only
    name it is launched by: ``RopeState.prepare_positions``), the kernel put back after.
    Refused where the kernel's parameters are not the stand-in's."""
    import importlib
    from targets.vllm.mrv2.table import stand_in_params
    if kernel_params() != stand_in_params(prepare_rope_positions):
        raise LookupError(f"{ROPE}.{KERNEL}{kernel_params()}: not what the stand-in takes")
    mod = importlib.import_module(ROPE)
    before = getattr(mod, KERNEL)
    setattr(mod, KERNEL, GridKernel(KERNEL, prepare_rope_positions))
    try:
        yield
    finally:
        setattr(mod, KERNEL, before)


# --- the toy models ----------------------------------------------------------------------

def upload(values, device, dtype=torch.int64) -> torch.Tensor:
    """Host values to the device without a sync: a fresh pinned buffer, copied
    non-blocking (what upstream's ``async_tensor_h2d`` does with pinned memory)."""
    return torch.as_tensor(values, dtype=dtype).pin_memory().to(device, non_blocking=True)


def encode_video(thw=(2, 4, 4), merge: int = 2, q: float = 0.5, seed: int = 0):
    """The video's encoder output as Qwen2.5-VL's EVS path makes it
    (``qwen2_5_vl.py:1630-1648``), on the host: upstream's ``compute_retention_mask``
    picks the kept tokens, ``compute_mrope_for_media`` their (t, h, w, llm_grid_w)
    channels, appended as 4 trailing columns. (kept embedding rows, their channels)"""
    from vllm.multimodal.video_prune import evs
    T, H, W = thw
    g = torch.Generator().manual_seed(seed)
    emb = torch.randn(T * (H // merge) * (W // merge), HIDDEN, generator=g)
    size = torch.tensor(thw)
    keep = evs.compute_retention_mask(emb, size, spatial_merge_size=merge, q=q)
    pos = evs.compute_mrope_for_media(size, merge)[keep]
    return torch.cat([emb[keep], pos.to(emb.dtype)], dim=1), pos


class ToyVideoModel:
    """What MRv2 asks of an M-RoPE model with an EVS pruner (``SupportsMRoPE``,
    ``supports_multimodal_pruning``), on a toy vocabulary."""

    supports_mrope = True
    supports_multimodal_pruning = True

    def __init__(self, device) -> None:
        self.device = torch.device(device)
        self.config = types.SimpleNamespace(image_token_id=IMAGE, video_token_id=VIDEO,
                                            vision_start_token_id=VISION_START)
        self.table = torch.arange(100 * HIDDEN, dtype=torch.float32).reshape(100, HIDDEN)
        self.host: Dict[int, tuple] = {}  # prompt length -> (tokens, positions), media only

    def get_mrope_input_positions(self, input_tokens, mm_features):
        """Text-like positions (each channel ``0..N-1``, delta 0), as before the pruned
        media's grid is known; the EVS recompute lays the media out on its grid."""
        n = len(input_tokens)
        positions = torch.arange(n, dtype=torch.int64).expand(3, n)
        if mm_features:
            assert n not in self.host
            self.host[n] = (list(input_tokens), positions.clone())
        return positions, 0

    def embed_input_ids(self, input_ids, multimodal_embeddings=None, is_multimodal=None):
        if self.table.device != input_ids.device:
            self.table = self.table.to(input_ids.device)
        return self.table[input_ids.to(torch.int64)]

    def _strip(self, multimodal_embeddings):
        # as qwen2_5_vl.py:1696-1699
        out = [mm[:, :-4] for mm in multimodal_embeddings]
        pos = [mm[:, -4:].permute(1, 0).long() for mm in multimodal_embeddings]
        return out, pos


def _sync_allowed():
    try:
        from vllm.utils.gpu_sync_debug import gpu_sync_allowed
    except ImportError:
        return contextlib.nullcontext()
    return gpu_sync_allowed()


class QwenLikePruner(ToyVideoModel):
    """``recompute_mrope_positions`` as Qwen2.5-VL's (``qwen2_5_vl.py:1652-1712``)."""

    def recompute_mrope_positions(self, input_ids, multimodal_embeddings, mrope_positions,
                                  num_computed_tokens):
        from vllm.multimodal.video_prune.evs import recompute_mrope_positions
        input_ids_t = input_ids.to(torch.long)
        out, pos = self._strip(multimodal_embeddings)
        with _sync_allowed():
            positions, delta = recompute_mrope_positions(
                input_ids_t, pos, mrope_positions, num_computed_tokens, VISION_START,
                IMAGE, VIDEO)
        return out, positions, delta


class SyncFreePruner(ToyVideoModel):
    """The same positions and delta, computed by upstream's evs function from the host
    copies this model kept (the prompt at ``get_mrope_input_positions``, the media's
    channels at encoding) and uploaded asynchronously: no device-to-host read."""

    media_channels: Optional[torch.Tensor] = None  # (kept tokens, 4), set at encoding

    def recompute_mrope_positions(self, input_ids, multimodal_embeddings, mrope_positions,
                                  num_computed_tokens):
        from vllm.multimodal.video_prune.evs import recompute_mrope_positions
        tokens, initial = self.host[int(input_ids.shape[0])]  # (a shape: host metadata)
        out, _ = self._strip(multimodal_embeddings)
        positions, delta = recompute_mrope_positions(
            torch.tensor(tokens), [self.media_channels.permute(1, 0).long()], initial,
            num_computed_tokens, VISION_START, IMAGE, VIDEO)
        return out, upload(positions, self.device), int(delta)


# --- upstream's model state, request state and encoder cache ---------------------------

def _config(uses_mrope: bool = True):
    """The ``ModelConfig`` answers ``get_rope_state`` / ``maybe_create_mm_pruner`` read."""
    mm = types.SimpleNamespace(is_multimodal_pruning_enabled=lambda: True)
    return types.SimpleNamespace(uses_mrope=uses_mrope, mrope_num_dims=3, uses_xdrope_dim=0,
                                 multimodal_config=mm, get_inputs_embeds_size=lambda: HIDDEN)


def _call(fn, **kwargs):
    """``fn`` with the keyword arguments its release takes."""
    params = inspect.signature(fn).parameters
    return fn(**{k: v for k, v in kwargs.items() if k in params})


class Slice:
    """Upstream's MRv2 model state for an M-RoPE model with an EVS pruner, stepped as
    ``GPUModelRunner.execute_model`` steps it."""

    def __init__(self, model: ToyVideoModel, device) -> None:
        from vllm.v1.worker.gpu.mm import rope
        from vllm.v1.worker.gpu.mm.encoder_cache import EncoderCache
        from vllm.v1.worker.gpu.mm.encoder_runner import EncoderRunner
        from vllm.v1.worker.gpu.model_states.default import DefaultModelState
        from vllm.v1.worker.gpu.model_states.mm_pruning import maybe_create_mm_pruner
        from vllm.v1.worker.gpu.states import RequestState
        self.device = torch.device(device)
        self.model = model
        self.req_states = RequestState(MAX_REQS, MAX_LEN, MAX_TOKENS, 0, 100, self.device)
        cache = EncoderCache()
        rope_state = _call(rope.get_rope_state, model_config=_config(), model=model,
                           max_num_reqs=MAX_REQS, max_num_tokens=MAX_TOKENS,
                           max_model_len=MAX_LEN, device=self.device)
        state = object.__new__(DefaultModelState)
        state.model, state.rope_state, state.device = model, rope_state, self.device
        state.prompt_embeds_state = None  # 0.33.0 on; prompt embeds off
        state.supports_mm_inputs = True
        state.encoder_cache = cache
        state.encoder_runner = EncoderRunner(model, MAX_TOKENS, HIDDEN, cache,
                                             torch.float32, self.device)
        state.mm_pruner = maybe_create_mm_pruner(_config(), model, rope_state, cache)
        assert state.mm_pruner is not None
        self.state, self.rope_state, self.cache = state, rope_state, cache
        self.outputs: List[torch.Tensor] = []  # each step's positions, as its forward got them
        self.prompts: Dict[str, List[int]] = {}

    def step(self, new: list, finished: list, batch: list, encoded: dict) -> None:
        """One step: ``finished`` request ids freed, ``new`` requests (namespaces with
        ``req_id``, ``prefill_token_ids``, ``mm_features``) added, then the batch
        (``(req_id, num_scheduled_tokens)``) prepared; ``encoded``: mm hash -> the
        encoder's output for this step (host), uploaded before the embeddings' gather."""
        rs, state = self.req_states, self.state
        for req_id in finished:  # finish_requests / free_states
            if hasattr(state, "remove_request"):
                state.remove_request(req_id)
            rs.remove_request(req_id)
            self.cache.remove_request(req_id)
        for req in new:  # add_requests (model_runner.py:1284-1338)
            n = len(req.prefill_token_ids)
            self.prompts[req.req_id] = list(req.prefill_token_ids)
            rs.add_request(req_id=req.req_id, prompt_len=n, all_token_ids=req.prefill_token_ids,
                           num_computed_tokens=0, max_tokens=4)
            self.cache.add_request(req.req_id, req.mm_features)
            state.add_request(rs.req_id_to_index[req.req_id], req)
        if new:
            rs.apply_staged_writes()
            state.apply_staged_writes()  # the step's first pool write
        for mm_hash, host in encoded.items():  # the encoder's output, made in this step
            self.cache.encoder_outputs[mm_hash] = upload(host, self.device, torch.float32)
        batch_ = self._input_batch(batch)
        embeds = getattr(state, "prepare_inputs_embeds", None) or state.get_mm_embeddings
        embeds({}, batch_, rs)  # EVS: recompute, then the second pool write
        state.prepare_inputs(batch_, rs)  # the rope kernel, on the current stream
        self.outputs.append(self.rope_state.get_positions(batch_.num_tokens).clone())
        for req_id, n in batch:  # MRv2's post-update kernel (ours): the device counts
            i = rs.req_id_to_index[req_id]
            rs.num_computed_tokens_np[i] += n
            rs.num_computed_prefill_tokens[i] = min(int(rs.num_computed_tokens_np[i]),
                                                    int(rs.prefill_len.np[i]))
            rs.num_computed_tokens.gpu[i] = int(rs.num_computed_tokens_np[i])

    def _input_batch(self, batch: list) -> types.SimpleNamespace:
        rs = self.req_states
        idx = np.array([rs.req_id_to_index[r] for r, _ in batch], dtype=np.int32)
        counts = np.array([n for _, n in batch], dtype=np.int32)
        qsl = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
        tokens: List[int] = []
        for (req_id, n), i in zip(batch, idx):
            start = int(rs.num_computed_tokens_np[i])
            prompt = self.prompts[req_id]
            tokens += [prompt[start + k] if start + k < len(prompt) else 1 for k in range(n)]
        total = int(qsl[-1])
        return types.SimpleNamespace(
            req_ids=[r for r, _ in batch], num_reqs=len(batch), idx_mapping_np=idx,
            idx_mapping=upload(idx, self.device, torch.int32), num_scheduled_tokens=counts,
            num_tokens=total, num_tokens_after_padding=total, query_start_loc_np=qsl,
            query_start_loc=upload(qsl, self.device, torch.int32),
            prefill_len_np=rs.prefill_len.np[idx].copy(),
            num_computed_tokens_np=rs.num_computed_tokens_np[idx].copy(),
            num_computed_prefill_tokens_np=rs.num_computed_prefill_tokens[idx].copy(),
            input_ids=upload(tokens, self.device, torch.int32))



def request(req_id: str, tokens: List[int], media: Optional[tuple] = None):
    """A new request as ``NewRequestData`` carries it (the fields MRv2's model state
    reads); ``media``: (mm hash, placeholder offset, length) of one video."""
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    feats = [] if media is None else [MultiModalFeatureSpec(
        data=None, modality="video", identifier=media[0],
        mm_position=PlaceholderRange(offset=media[1], length=media[2]))]
    return types.SimpleNamespace(req_id=req_id, prefill_token_ids=list(tokens),
                                 prompt_token_ids=list(tokens), mm_features=feats)


VIDEO_PROMPT = [11, 12, VISION_START] + [VIDEO] * 4 + [VISION_END, 13, 14]


def three_steps(rt, model: ToyVideoModel, wait_k2: bool = True) -> types.SimpleNamespace:
    """Steps k-2, k-1, k of MRv2 under async scheduling, on ``rt``'s current stream:

    * k-2: requests A and D (text) prefill; the step's output event E recorded;
    * k-1: the main stream stalled as the step starts (a busy GPU, as the fault point
      ``vllm.before_execute``); B (text) added -- one pool write -- and A, D decode: the
      rope kernel reads the slot just written, and stays queued;
    * k: the host has waited for E only (F_{k-2}); D finished (its stop token was in step
      k-2's output, after step k-1 had scheduled it) and freed; C, with a video, takes
      D's request index: ``add_request`` writes the pool once, the EVS recompute's
      ``apply_staged_writes`` a second time -- into the slot step k-1's kernel reads.

    Everything is left queued to the end (one ``synchronize``). Returns the slice, the
    slot step k-1 read (``slot``) and the one the first write took (``first_slot``), and
    where step k begins in the trace (``k_start``). ``wait_k2=False`` leaves out the
    host's wait for step k-2 (a check that the first write's safety rests on it)."""
    main = rt.module.current_stream()
    rt.label(main, "main")
    s = Slice(model, rt.device)
    host_embeds, channels = encode_video()
    model.media_channels = channels
    pool = s.rope_state.prefill_delta.pool
    s.step([request("A", [1, 2, 3, 4]), request("D", [5, 6, 7])], [],
           [("A", 4), ("D", 3)], {})
    done_k2 = rt.module.Event()
    done_k2.record()
    rt.stall(None)
    s.step([request("B", [8, 9])], [], [("A", 1), ("D", 1), ("B", 2)], {})
    slot = pool._curr
    rt.module.Event().record()
    if wait_k2:
        done_k2.synchronize()  # F_{k-2}: all the host has waited for as it prepares step k
    k_start = len(rt.trace.log)
    d_index = s.req_states.req_id_to_index["D"]
    s.step([request("C", VIDEO_PROMPT, ("video-0", 3, 4))], ["D"],
           [("A", 1), ("B", 1), ("C", len(VIDEO_PROMPT))], {"video-0": host_embeds})
    assert s.req_states.req_id_to_index["C"] == d_index  # the freed index, reused
    first_slot = (slot + 1) % pool.max_concurrency
    rt.synchronize()
    return types.SimpleNamespace(slice=s, slot=slot, first_slot=first_slot, k_start=k_start,
                                 pool=pool, reused=d_index,
                                 outputs=[o.cpu().tolist() for o in s.outputs])
