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

* ``kernels`` / ``spec_kernels``: torch stand-ins for every Triton kernel the path
  launches, and ``seams``: where they (and the compiled UVA-view op) are bound for a run;
* ``model``: a toy EAGLE head (MRv2's speculator is EAGLE-only), the greedy successor
  semantics kept so outputs stay checkable;
* ``runner``: the runner subclass (stall points, the block tables' pointer registry) and
  the switch set for an engine's construction;
* ``grammar``: structured outputs for the toy model (MRv2 copies drafts to the host only
  for such batches), behind vLLM's own grammar-backend interfaces.

Runs on the simulator (the UVA view on CUDA is not done yet); written against 0.17.0
(0.17.1 runs too; later releases moved the modules, and a run stops there as code that
does not fit).
"""
