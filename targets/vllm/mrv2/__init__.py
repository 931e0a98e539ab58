"""Model Runner V2 (``vllm/v1/worker/gpu/``, upstream's ``VLLM_USE_V2_MODEL_RUNNER``)
driven whole under the vLLM target's engine loop (``ServerArgs.vllm_runner == "v2"``).

Upstream's, unmodified: the MRv2 ``GPUModelRunner`` and everything it calls on the
greedy / EAGLE / async-scheduling path -- ``InputBatch`` and ``InputBuffers``,
``BlockTables``, ``RequestState``, the UVA staging (``UvaBuffer``, ``UvaBufferPool``,
``UvaBackedTensor``, ``StagedWriteTensor``), the ``Sampler``, rejection sampling, the
``EagleSpeculator``, ``DraftTokensHandler``, ``AsyncOutput``, the structured-outputs
worker -- under the same ``EngineCore`` / ``AsyncScheduler`` / ``Worker`` as the V1 path
(``targets/vllm/engine/``), which selects MRv2 by upstream's own switch.

Ours, named as such:

* ``kernels`` / ``spec_kernels`` (0.17.0's kernels), ``kernels_late`` /
  ``spec_kernels_late`` / ``draft_kernels_late`` (0.34.0's) and ``variants`` (the same
  work under other releases' parameter lists): torch stand-ins for every Triton kernel
  the path launches; ``table``: which kernel each stands in for, per release, and the
  modules the path drives (the contract checks both from source); ``seams``: where they
  (and the compiled UVA-view op) are bound for a run -- through vLLM's own kernel-
  override seam where it passes the launch grid (0.34.0);
* ``model``: a toy EAGLE head (MRv2's speculator is EAGLE-family), the greedy successor
  semantics kept so outputs stay checkable, and the dense toy target as MRv2's loaders
  read it; ``backend``: the toy attention backend under later releases' interface;
* ``runner``: the runner subclass (stall points, the block tables' pointer registry) and
  the switch set for an engine's construction; ``worker``: upstream's worker with its
  CUDA start-up replaced (no import of the V1 runner, which 0.34.0 no longer ships);
  ``probe``: the drafter's sampling inputs against what the host staged (S1);
* ``grammar``: structured outputs for the toy model (MRv2 copies drafts to the host only
  for such batches), behind vLLM's own grammar-backend interfaces.

Runs on the simulator (the UVA view on CUDA is not done yet), on 0.17.0, 0.17.1, 0.18.0,
0.19.0, 0.23.0, 0.27.1, 0.33.0 and 0.34.0; 0.16.0's kernels differ (the contract names
the first, and its MRv2 scenarios stop there).
"""
