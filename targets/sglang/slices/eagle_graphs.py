"""Ours, for the EAGLE v2 slice: its three forwards as CUDA graph replays, where the device
captures graphs (torch.cuda and the simulator; ``ServerArgs.cuda_graph``).

* ``ToyVerifyGraphs`` -- the target's decode graph runner for the verify
  (``model_runner.decode_cuda_graph_runner``): the toy forward per batch-size bucket.
  Upstream's ``eagle_prepare_for_verify`` loads it (``load_batch``), on the plan stream
  when there is one; the verify replays it.
* ``ToyDraftGraphs`` -- the draft worker's ``cuda_graph_runner``: each bucket's graph is
  upstream's own ``EagleDraftWorker.draft_forward`` (every draft step: top-k selection,
  the draft runner's forward, the chain postprocess or the tree's top-k) captured over
  static inputs. Upstream's ``draft`` calls ``execute`` and, under rejection sampling,
  clones the one output it reads after the target forward (``draft_probs``).
* ``ToyDraftExtendGraphs`` -- its ``cuda_graph_runner_for_draft_extend``: the draft
  runner's forward over the verify window plus the row selection (``select_index``)
  before the head, as upstream's runner moves it (0.5.20 on); the hidden states it
  returns are a copy (they survive into the next step's draft), the logits a view.
  Where the release's runner takes no ``select_index`` (0.5.19), the window's rows are
  handed out as views and the worker selects them itself, as that runner does.

Each graph's outputs live in the graph's static buffers, which the bucket's next replay
overwrites: whatever upstream's code keeps of them across a step is judged by the race
detector like any other buffer. Captured graphs do not publish read-done (an event
recorded in a capture is a graph node, not something the scheduler can wait on); as
upstream's runners without an in-graph marker do, the draft runners publish it after
the replay, so the WAR barrier covers the reads inside the graph.

Upstream's real runners (``EAGLEDraftCudaGraphRunner``, ``EAGLEDraftExtendCudaGraphRunner``)
sit on its decode graph runner and attention backends, which the toy model has not; these
are the interface those runners offer the worker (``can_run_graph``, ``execute``), as an
out-of-tree platform's runner (``get_speculative_graph_runner_cls``) would. Not modelled:
sharing one memory pool between the three graphs (the simulator never reuses memory: a
block recycled under a live view is not seen).
"""
from __future__ import annotations

import contextlib
import types
import weakref
from typing import Dict, Iterator, Optional

import torch

from toys.graph_runner import CAPTURE_BS, VerifyGraphRunner, capture_graphs

from targets.sglang.boundary import upstream


@contextlib.contextmanager
def capturing(runner) -> Iterator[None]:
    """The runner's forwards neither publish read-done nor stall while a graph is
    captured (warm-up included): the graph runner publishes after each replay."""
    runner.in_capture = True
    try:
        yield
    finally:
        runner.in_capture = False


def _buckets(max_bs: int):
    return [bs for bs in CAPTURE_BS if bs <= max_bs]


class ToyVerifyGraphs:
    """The target's verify graphs (module docstring). ``load_batch`` copies the verify's
    input ids into the bucket's static buffer and gathers the rows' metadata;
    ``replay`` (the verify forward, on the forward stream) runs the graph and hands out
    views of its static outputs."""

    def __init__(self, model, device, D: int, max_bs: int, req_to_token,
                 aux_layers: int = 1) -> None:
        from targets.sglang.slices.eagle_runners import aux_hidden

        def forward(ids):
            hidden, logits = model.forward_with_hidden(ids)
            return aux_hidden(hidden, aux_layers), logits
        self.graphs = VerifyGraphRunner(model, device, D, max_bs, forward=forward)
        self.D = D
        self.req_to_token = req_to_token
        self.bs = None  # the loaded bucket (upstream's runner exposes it)
        # the forward batch last loaded, weakly: upstream's runner copies a batch into
        # its static buffers and keeps no reference to it -- a strong one here would keep
        # the verify's tensors alive past their owners and hide a lifetime bug
        self._loaded: Optional[weakref.ref] = None

    def can_run_graph(self, forward_batch) -> bool:
        return self.graphs.can_run(forward_batch.batch_size)

    def load_batch(self, forward_batch) -> None:
        fb = forward_batch
        n = fb.input_ids.shape[0]
        self.bs = next(b for b in self.graphs.capture_bs if b * self.D >= n)
        self.graphs.input_ids[self.bs][:n].copy_(fb.input_ids)
        self.req_to_token[fb.req_pool_indices.to(torch.int64)].sum()  # the metadata
        self._loaded = weakref.ref(fb)

    def loaded(self, forward_batch) -> bool:
        """Was ``forward_batch`` the one ``load_batch`` took last?"""
        return self._loaded is not None and self._loaded() is forward_batch

    def replay(self, forward_batch):
        n = forward_batch.input_ids.shape[0]
        self.graphs.graphs[self.bs].replay()
        hidden, logits = self.graphs.logits[self.bs]
        return hidden[:n], logits[:n]


class _BucketGraphs:
    """One graph per batch-size bucket over static inputs of the bucket's size: ``body``
    is captured (``capture_graphs``: largest first, one pool, the capture stream);
    ``inputs(bs)`` the static tensors a replay copies the batch into."""

    def __init__(self, runner, max_bs: int) -> None:
        self.runner = runner
        self.device = torch.device(runner.device)
        self.mod = torch.get_device_module(self.device)
        self.capture_bs = _buckets(max_bs)
        self.inputs: Dict[int, Dict[str, torch.Tensor]] = {}
        self.graphs: Dict[int, object] = {}
        self.outputs: Dict[int, object] = {}

    def capture(self) -> None:
        def body(bs: int):
            if bs not in self.inputs:  # allocated on the capture stream, before warm-up
                self.inputs[bs] = self.static_inputs(bs)
            return self.body(bs, self.inputs[bs])

        with capturing(self.runner):
            captured = capture_graphs(self.mod, self.mod.Stream(),
                                      self.mod.graph_pool_handle(), self.capture_bs, body)
        for bs, (graph, out) in captured.items():
            self.graphs[bs], self.outputs[bs] = graph, out

    def can_run_graph(self, forward_batch) -> bool:
        return (not forward_batch.forward_mode.is_idle()
                and 0 < forward_batch.batch_size <= self.capture_bs[-1])

    def bucket(self, bs: int) -> int:
        return next(b for b in self.capture_bs if b >= bs)

    def replay(self, bucket: int):
        """Replay the bucket's graph, then publish read-done -- after the replay: the
        runner's reads are inside it -- and hand out the graph's outputs."""
        self.graphs[bucket].replay()
        self.runner._record_shared_read_done(replayed=True)
        return self.outputs[bucket]

    def zeros(self, *shape, dtype=torch.int64) -> torch.Tensor:
        return torch.zeros(shape, dtype=dtype, device=self.device)


class ToyDraftGraphs(_BucketGraphs):
    """The draft decode's graphs: upstream's ``draft_forward`` captured (module
    docstring). ``execute`` copies the batch's relayed draft state, positions, write
    slots and rows into the bucket's inputs, replays, publishes read-done and returns
    ``(parent_list, top_scores_index, draft_tokens, draft_probs)`` as views of the
    graph's outputs, as upstream's runner does."""

    def __init__(self, draft_worker, max_bs: int) -> None:
        super().__init__(draft_worker.draft_runner, max_bs)
        self.worker = draft_worker
        self.topk, self.steps = draft_worker.topk, draft_worker.speculative_num_steps
        self.capture()

    def static_inputs(self, bs: int) -> Dict[str, torch.Tensor]:
        k, cfg = self.topk, self.runner.model_config
        return dict(topk_p=self.zeros(bs, k, dtype=torch.float32), topk_index=self.zeros(bs, k),
                    hidden_states=self.zeros(bs, cfg.spec_hidden_size, dtype=cfg.dtype),
                    positions=self.zeros(bs * k), out_cache_loc=self.zeros(bs * k * self.steps),
                    req_pool_indices=self.zeros(bs),
                    seq_lens=torch.ones(bs, dtype=torch.int64, device=self.device))

    def body(self, bs: int, s: Dict[str, torch.Tensor]):
        # a fresh batch over the static inputs each run: draft_forward rebinds its
        # fields (input ids, per-step slots, hidden states) as it steps
        spec = types.SimpleNamespace(topk_p=s["topk_p"], topk_index=s["topk_index"],
                                     hidden_states=s["hidden_states"], draft_probs=None,
                                     dsa_topk_indices=None)
        fb = types.SimpleNamespace(
            forward_mode=upstream.ForwardMode.DECODE, batch_size=bs, spec_info=spec,
            input_ids=None, positions=s["positions"], out_cache_loc=s["out_cache_loc"],
            req_pool_indices=s["req_pool_indices"], seq_lens=s["seq_lens"],
            sampling_info=types.SimpleNamespace(is_all_greedy=True),
            moe_num_token_non_padded=None, mrope_positions=None)
        return self.worker.draft_forward(fb)

    def execute(self, forward_batch):
        fb, bs = forward_batch, forward_batch.batch_size
        b = self.bucket(bs)
        s, spec = self.inputs[b], fb.spec_info
        s["topk_p"][:bs].copy_(spec.topk_p)
        s["topk_index"][:bs].copy_(spec.topk_index)
        s["hidden_states"][:bs].copy_(spec.hidden_states)
        s["positions"][:fb.positions.shape[0]].copy_(fb.positions)
        s["out_cache_loc"][:fb.out_cache_loc.shape[0]].copy_(fb.out_cache_loc)
        s["req_pool_indices"][:bs].copy_(fb.req_pool_indices)
        s["seq_lens"][:bs].copy_(fb.seq_lens)
        return tuple(None if t is None else t[:bs] for t in self.replay(b))


class ToyDraftExtendGraphs(_BucketGraphs):
    """The draft extend's graphs (module docstring): the draft runner's forward over
    each request's verify window, the rows ``select_index`` picks (each request's last
    accepted position) selected inside the graph."""

    def __init__(self, draft_runner, D: int, hidden_in: int, max_bs: int,
                 selects: bool = True) -> None:
        super().__init__(draft_runner, max_bs)
        self.D, self.hidden_in = D, hidden_in
        # the interface of the release's runner: the row selection inside the graph
        # (``execute(forward_batch, select_index)``, 0.5.20 on), or the whole window's
        # rows handed out as views of the graph's buffers, the worker selecting them
        # after the replay (``execute(forward_batch)``, 0.5.19)
        self.selects = selects
        self.capture()

    def static_inputs(self, bs: int) -> Dict[str, torch.Tensor]:
        n, cfg = bs * self.D, self.runner.model_config
        return dict(input_ids=self.zeros(n), positions=self.zeros(n),
                    hidden_states=self.zeros(n, self.hidden_in, dtype=cfg.dtype),
                    req_pool_indices=self.zeros(bs), select_index=self.zeros(bs),
                    seq_lens=torch.ones(bs, dtype=torch.int64, device=self.device))

    def body(self, bs: int, s: Dict[str, torch.Tensor]):
        fb = types.SimpleNamespace(
            forward_mode=upstream.ForwardMode.DRAFT_EXTEND_V2, batch_size=bs,
            input_ids=s["input_ids"], positions=s["positions"],
            req_pool_indices=s["req_pool_indices"], seq_lens=s["seq_lens"],
            spec_info=types.SimpleNamespace(hidden_states=s["hidden_states"]))
        hidden, logits = self.runner.forward_all(fb)
        if not self.selects:
            return logits, hidden
        return logits[s["select_index"]], hidden[s["select_index"]]

    def execute(self, forward_batch, select_index=None):
        fb, bs = forward_batch, forward_batch.batch_size
        b = self.bucket(bs)
        s, n = self.inputs[b], fb.input_ids.shape[0]
        s["input_ids"][:n].copy_(fb.input_ids)
        s["positions"][:n].copy_(fb.positions)
        s["hidden_states"][:n].copy_(fb.spec_info.hidden_states)
        s["req_pool_indices"][:bs].copy_(fb.req_pool_indices)
        s["seq_lens"][:bs].copy_(fb.seq_lens)
        if not self.selects:  # the worker's own row selection copies out of the views
            logits, hidden = self.replay(b)
            return upstream.LogitsProcessorOutput(next_token_logits=logits[:n],
                                                  hidden_states=hidden[:n])
        s["select_index"][:bs].copy_(select_index)
        logits, hidden = self.replay(b)
        # the hidden states survive into the next step's draft: out of the graph's buffer
        return upstream.LogitsProcessorOutput(next_token_logits=logits[:bs],
                                              hidden_states=hidden[:bs].clone())
