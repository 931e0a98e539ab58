"""Upstream's own ``ModelRunner`` under the sglang target (issue 57, item 3).

* ``build`` -- upstream's ``ModelRunner`` from ``__new__`` plus upstream's own init steps,
  over the target's pools, with the stand-ins below; ``ngram_model_runner`` is the NGRAM
  toy worker's (None where the release does not fit: the toy model's forward runs);
* ``forward`` -- the worker's prefill and verify through ``ForwardBatch.init_new`` and
  ``ModelRunner.forward``;
* ``model`` -- the declared stand-in for the model's layers (the toy bigram, attending
  through upstream's ``RadixAttention``: the KV writes and reads are upstream's);
* ``attention`` -- the declared stand-in for the attention backend's kernel (upstream's
  ``torch_native`` class with a host-sync-free, capture-safe extend for prefill and verify);
* ``graphs`` -- what the decode graph runner's capture needs of the simulator's platform;
* ``ranks`` -- a one-GPU server's ranks and process groups (upstream's class), kept the
  release's way (``contract.RANK_WAYS``: on the context, or in ``parallel_state``'s
  globals before 0.5.21, restored after the run).

Driven where ``build.fits`` reads the release's source as having all of it (of the
releases set up here, 0.5.19-0.5.23); elsewhere ``contract.undriven(root, "model_runner")``
names the piece missing and the NGRAM verify is the toy model's forward.

The toy model comes in as an argument: nothing here imports the toy world.
"""
