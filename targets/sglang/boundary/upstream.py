"""The upstream names the sglang target drives, imported once from the installed package
(``bootstrap.load``: stand-ins for absent GPU packages first). Importing this module
imports sglang: only the sglang target does.
"""
from __future__ import annotations

import contextlib
import warnings

from seams import process

from targets.sglang.boundary.bootstrap import load

with warnings.catch_warnings():
    # sglang warns at import that AWQ/GGUF/Triton need a GPU: true, and not our concern
    warnings.simplefilter("ignore")
    _modules = load()
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput

overlap_utils = _modules["sglang.srt.managers.overlap_utils"]
ngram_info = _modules["sglang.srt.speculative.ngram_info"]
schedule_batch = _modules["sglang.srt.managers.schedule_batch"]
managers_utils = _modules["sglang.srt.managers.utils"]
scheduler = _modules["sglang.srt.managers.scheduler"]
spec_utils = _modules["sglang.srt.speculative.spec_utils"]
xgrammar_backend = _modules["sglang.srt.constrained.xgrammar_backend"]

from sglang.srt.speculative.spec_info import SpeculativeAlgorithm  # noqa: E402
from sglang.srt.disaggregation.utils import DisaggregationMode  # noqa: E402
from sglang.srt.environ import envs  # noqa: E402

# Classes by name (a run-time patch replaces an attribute *of* the class, which every
# holder of the class sees). Module-level functions are always called through their
# module (``spec_utils.build_grammar_vocab_mask(...)``): a name bound here would keep the
# original when a variant or a mutation patches the function.
FutureMap = overlap_utils.FutureMap
NgramVerifyInput = ngram_info.NgramVerifyInput
ScheduleBatch = schedule_batch.ScheduleBatch
GenerationBatchResult = managers_utils.GenerationBatchResult
Scheduler = scheduler.Scheduler
# absent from older releases (no RelayPayload before 0.5.15, no GrammarTree before 0.5.17):
# the scenarios that need them are "not applicable" there (environments.NEEDS)
RelayPayload = getattr(overlap_utils, "RelayPayload", None)
GrammarTree = getattr(spec_utils, "GrammarTree", None)
from sglang.srt.constrained import base_grammar_backend  # noqa: E402

GrammarMask = getattr(base_grammar_backend, "GrammarMask", None)  # with GrammarTree
# a request's extend range, as schedule_batch builds it (0.5.17-0.5.21: Req.extend_range)
Range = getattr(schedule_batch, "Range", None)


def take_gpu_paths() -> None:
    """The GPU code paths: the FutureMap's private D2H stream and pinned seq-lens mirror
    (and the confidence relay's ring) exist only when ``overlap_utils._is_cuda``, which is
    computed from torch.cuda at import. On a GPU it is True; the simulator stands for that
    GPU, so it is set as it is there (once, after the contract has checked the attribute
    exists: it is read when a FutureMap is built)."""
    overlap_utils._is_cuda = True
    process.note("sglang-gpu-paths")


def import_named(names):
    """``{key: module}`` for ``{key: dotted module name}``: a slice's upstream modules,
    imported on first use (a release without the slice's code fails only when it runs)."""
    import importlib
    return {k: importlib.import_module(v) for k, v in names.items()}


def current_server_args():
    """The run's server args (made current by ``server_config``) where the release keeps
    them: its runtime context (0.5.15 on), else the server_args module's global (0.5.14)."""
    from sglang.srt import runtime_context as rc
    if hasattr(rc, "get_server_args"):
        return rc.get_server_args()
    from sglang.srt.server_args import get_global_server_args
    return get_global_server_args()


def with_server_args(fn, *args, **kwargs):
    """Call upstream's ``fn`` as its own caller does: where it has a ``server_args``
    parameter (0.5.16-0.5.18's, before the runtime context held the config) the current
    server's args are passed; later releases' read the context themselves."""
    import inspect
    if "server_args" in inspect.signature(fn).parameters:
        from sglang.srt.server_args import get_global_server_args
        kwargs["server_args"] = get_global_server_args()
    return fn(*args, **kwargs)


@contextlib.contextmanager
def server_config(speculative_algorithm: str, device, **server_args):
    """Upstream's runtime context for one run on ``device``, projected from
    ``ServerArgs(...)`` by its ``set_server_args`` (the resolution pipeline, which loads
    the model's HF config, is not run: what it would resolve is given here -- the
    device's type, page size 1, the toy's) and made
    current the way the release makes a server's config current
    (``contract.SERVER_CONFIG_WAYS``, read from its source): a context of the run's own
    under ``use_context``, or -- where the context is one per process -- that context
    snapshotted, reset, given the run's server args and restored after the run, as a
    launch that fails restores it. Either way the run starts from none of the config of
    a run before it, and leaves none behind. What the slices' code reads of the
    server's config (the spec algorithm and its draft shape, the page size)."""
    from sglang.srt import runtime_context as rc
    from sglang.srt.server_args import ServerArgs
    from targets import static
    from targets.sglang.boundary import contract
    way = contract.server_config_way(static.package_root("sglang"))
    if way is None:
        raise RuntimeError("this sglang release has none of the ways specrace makes a "
                           "server's config current (contract.SERVER_CONFIG_WAYS)")
    # the attention is the toy's; a backend without Triton makes upstream's prefill row
    # writer (write_cache_indices) take its host-looped path -- its Triton kernel reads
    # the prefix rows through raw device pointers, which neither the simulator nor a CUDA
    # trace can see
    # a ServerArgs without ``resolve_once`` resolves in its constructor (0.5.16-0.5.18),
    # loading the model's HF config: "dummy" is upstream's own name for a run without a
    # model, which stops that resolution before it reads one
    resolves = not hasattr(ServerArgs, "resolve_once")
    # the device's type, as a launched server resolves it: a ServerArgs without one
    # leaves upstream to ask torch for the current accelerator (the runtime context's
    # named streams), and torch answers with a registered PrivateUse1 backend before
    # CUDA -- once the simulator has run in the process, a CUDA run's capture stream
    # would be the simulator's (measured on an H100)
    import torch
    args = ServerArgs(model_path="dummy" if resolves else "specrace-toy", page_size=1,
                      attention_backend="torch_native", device=torch.device(device).type,
                      speculative_algorithm=speculative_algorithm, **server_args)
    if way == "use_context":
        ctx = rc.RuntimeContext(parallel=rc.ParallelContext())
        ctx.set_server_args(args)
        with rc.use_context(ctx):
            yield
        return
    if way == "publish":
        from sglang.srt.server_args import set_global_server_args_for_scheduler
        rc.reset_context()
        try:
            set_global_server_args_for_scheduler(args)
            yield
        finally:
            rc.reset_context()  # nothing of the run's config outlives it
        return
    if way == "module_global":
        from sglang.srt import server_args as sa
        before = sa._global_server_args
        try:
            sa.set_global_server_args_for_scheduler(args)
            yield
        finally:
            sa._global_server_args = before  # nothing of the run's config outlives it
        return
    state = rc.snapshot_context()
    try:
        rc.reset_context()
        rc.get_context().set_server_args(args)
        yield
    finally:
        # the snapshot holds the parallel context's stamp (the ranks and groups the run
        # stamps: runner/ranks.py) by reference, not by value: reset first, so the
        # run's one-rank groups on its device do not outlive it in the restored context
        rc.reset_context()
        rc.restore_context(state)
