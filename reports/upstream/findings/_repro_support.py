"""What the standalone repros beside this file share: the command line, the device (its
streams, events and copies through torch's device-generic API, so one script runs on a
GPU and, as a smoke run of the same upstream calls, on a CPU), the absent GPU-only
packages, a bulk copy load, and the one JSON line each prints.

Nothing here stubs a module the server imports for itself. Where a GPU-only package that
sglang imports at module level is absent (``sgl_kernel``, ``flashinfer``, ``deep_gemm`` on
a bare GPU image; ``triton`` too on a CPU), specrace's declared stand-ins take its place
(``targets/sglang/boundary/bootstrap.py``: inert modules that ``inspect.signature`` and
subclassing accept, and that fail loudly if called); a python-only vLLM (no ``vllm._C``)
gets vLLM's base platform first, as specrace runs it (``targets/vllm/boundary/
platform.py``). With the server's full install, neither is used and specrace is not needed.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import threading

import torch

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SGLANG_GPU_ONLY = ("triton", "torchvision", "sgl_kernel", "flashinfer", "deep_gemm")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # bad input: one line, exit 2
        self.exit(2, f"{self.prog}: error: {message}\n")


def parse(doc: str, argv=None, loads=("none",)):
    """``--trials N``, ``--device cpu|cuda`` (default: cuda where there is one) and, for a
    script with a copy load, ``--load`` (comma-separated, from ``loads``)."""
    p = _Parser(description=doc.strip().splitlines()[0])
    p.add_argument("--trials", type=int, default=200)
    p.add_argument("--device", choices=("cpu", "cuda"),
                   default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--forward-us", type=float, default=0.0,
                   help="the next forward's duration before it writes (a GPU spin on "
                        "its stream; default 0: the write right behind)")
    p.add_argument("--load", default=",".join(loads),
                   help=f"comma-separated, of: {', '.join(loads)}")
    args = p.parse_args(argv)
    if args.trials < 1:
        p.error("--trials must be at least 1")
    if not 0 <= args.forward_us <= 1e6:
        p.error("--forward-us must be between 0 and 1e6")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    args.load = [x for x in args.load.split(",") if x]
    bad = [x for x in args.load if x not in loads]
    if bad or not args.load:
        p.error(f"--load {','.join(bad) or '(none given)'}: not one of {', '.join(loads)}")
    return args


def sglang_stand_ins() -> list:
    """Stand in for the absent GPU-only packages sglang imports at module level (above);
    returns their names."""
    missing = [p for p in SGLANG_GPU_ONLY if importlib.util.find_spec(p) is None]
    if missing:
        if REPO not in sys.path:
            sys.path.append(REPO)  # after the server's own: it only adds specrace
        from targets.sglang.boundary import bootstrap
        bootstrap.install_stand_ins()
    return missing


def vllm_platform() -> str:
    """A python-only vLLM (no compiled ``vllm._C``) would resolve CudaPlatform on a GPU,
    which loads ``vllm._C`` at import: vLLM's base platform goes in first, as specrace does
    (its environment defaults too: no usage stats, no network). Returns which."""
    if importlib.util.find_spec("vllm._C") is not None:
        return "vllm's own"
    if REPO not in sys.path:
        sys.path.append(REPO)
    from targets.vllm.boundary import platform
    platform.set_env_defaults()
    platform.base_platform_first()
    return "base (python-only vllm)"


class Device:
    """One device's streams, events and host buffers through torch's generic API: CUDA on
    a GPU; on a CPU torch.cpu's (every copy there is ordered: the smoke run of the same
    calls must print 0 stale)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.device = torch.device(kind)
        self.mod = torch.get_device_module(self.device)
        self.pinned = kind == "cuda"  # a CPU-only torch has no pinned allocator

    def stream(self):
        return self.mod.Stream()

    def on(self, stream):
        return self.mod.stream(stream)

    def event(self):
        return self.mod.Event()

    def synchronize(self) -> None:
        if self.kind == "cuda":
            torch.cuda.synchronize()

    def stall_us(self, us: float) -> None:
        """Keep the current stream busy ``us`` microseconds (a GPU spin: torch's own
        ``cuda._sleep``); nothing on a CPU."""
        if us > 0 and self.kind == "cuda":
            rate = getattr(self, "_cycles_per_us", None) or self._calibrate()
            torch.cuda._sleep(int(us * rate))

    def _calibrate(self) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(1_000_000)
        end.record()
        end.synchronize()
        self._cycles_per_us = 1_000_000 / (start.elapsed_time(end) * 1000)
        return self._cycles_per_us

    def name(self) -> str:
        return torch.cuda.get_device_name(0) if self.kind == "cuda" else "cpu"


class GraphForward:
    """A step's forward whose output later readers hold views of: on a GPU a CUDA graph
    replayed into its static output buffer (a decode graph's, the DSpark epilogue's); on a
    CPU, where no graph is captured, an eager forward writing a fresh output. The output
    holds the step number everywhere."""

    def __init__(self, dev: Device, stream, shape, dtype) -> None:
        self.dev, self.shape = dev, shape
        self.step_in = torch.zeros(1, dtype=dtype, device=dev.device)
        self.static = torch.zeros(*shape, dtype=dtype, device=dev.device)
        if dev.kind == "cuda":
            self.graph = torch.cuda.CUDAGraph()
            with dev.on(stream):
                for _ in range(2):  # warm-up before capture
                    self.static.copy_(self.step_in.expand(*shape))
                stream.synchronize()
                with torch.cuda.graph(self.graph, stream=stream):
                    self.static.copy_(self.step_in.expand(*shape))

    def __call__(self, step: int) -> torch.Tensor:
        self.step_in.fill_(step)
        if self.dev.kind == "cuda":
            self.graph.replay()
            return self.static
        return self.step_in.expand(*self.shape).clone()


class SchedulerStreams:
    """What sglang's ``Scheduler._copy_result_to_cpu`` reads of the scheduler: its two
    streams, the copy stream's context (a fresh one each time it is entered, as the
    scheduler enters its own once per call) and the async-D2H switch (off: the copy is
    issued inline, the default)."""

    def __init__(self, dev: Device, forward, copy) -> None:
        self.dev, self.forward_stream, self.copy_stream = dev, forward, copy
        self.enable_async_d2h_copy = False

    @property
    def copy_stream_ctx(self):
        return self.dev.on(self.copy_stream)


class BulkD2H:
    """A second stream doing 256 MiB device-to-host copies back to back (KV offload /
    HiCache write-back traffic) while the trials run; nothing on a CPU."""

    def __init__(self, dev: Device, mib: int = 256) -> None:
        self.dev, self.mib = dev, mib
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        src = torch.empty(self.mib << 20, dtype=torch.uint8, device="cuda")
        dst = torch.empty(self.mib << 20, dtype=torch.uint8, pin_memory=True)
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            while not self.stop.is_set():
                dst.copy_(src, non_blocking=True)
                stream.synchronize()

    def __enter__(self):
        if self.dev.kind == "cuda":
            self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join()


def per_load(dev: Device, loads, run, kinds=None) -> dict:
    """``run()``'s stale count under each of ``loads``: ``none`` bare, any other beside
    the traffic its class in ``kinds`` makes (default: ``bulk-d2h``, :class:`BulkD2H`)."""
    kinds = {"bulk-d2h": BulkD2H} if kinds is None else kinds
    stale = {}
    for load in loads:
        if load == "none":
            stale[load] = run()
        else:
            with kinds[load](dev):
                stale[load] = run()
    return stale

def measure(finding: str, package: str, args, upstream, trials, kinds=None, **extra) -> int:
    """The run every script makes: ``trials(dev)`` (its stale count) under each of
    ``args.load`` on ``args.device``, then the one JSON line. Returns the exit status."""
    dev = Device(args.device)
    stale = per_load(dev, args.load, lambda: trials(dev), kinds)
    report(finding, package, dev, args.trials, stale, upstream, stall="none",
           forward_us=args.forward_us, **extra)
    return 0


def readback_trials(dev: Device, n: int, Scheduler, shape, dtype, batch, make_result,
                    seen, forward_us: float) -> int:
    """sglang's readback race, ``n`` times: step k's result (``make_result`` of a view of
    the graph's static output) read back by upstream's ``Scheduler._copy_result_to_cpu``
    on the copy stream, while step k+1's replay rewrites that output on the forward
    stream with nothing waiting for the copy. Returns how often ``seen(result)`` -- the
    value the result processor reads after ``copy_done`` -- is not k."""
    fwd_stream, copy_stream = dev.stream(), dev.stream()
    forward = GraphForward(dev, fwd_stream, shape, dtype)
    sched = SchedulerStreams(dev, fwd_stream, copy_stream)
    stale = 0
    for step in range(1, n + 1):
        with dev.on(fwd_stream):
            result = make_result(forward(step))  # step k's result: views of its output
            result.copy_done = dev.event()
            Scheduler._copy_result_to_cpu(sched, result, batch)  # upstream's readback
            dev.stall_us(forward_us)  # the next forward's work before its epilogue
            forward(step + 10_000)  # step k+1; nothing waited for the copy
        result.copy_done.synchronize()  # what the result processor waits on
        stale += int(seen(result) != step)
        dev.synchronize()
    return stale


def report(finding: str, package: str, dev: Device, trials: int, stale: dict,
           upstream, **extra) -> None:
    """The one JSON line: ``stale`` maps each condition to ``"k/N"``."""
    import importlib.metadata as md
    out = {"finding": finding, package: md.version(package), "device": dev.kind,
           "gpu": dev.name(), "torch": torch.__version__, "trials": trials,
           "stale": {k: f"{v}/{trials}" for k, v in stale.items()},
           "upstream": list(upstream), **extra}
    if dev.kind == "cpu" and "not_run" not in extra:
        out["cpu"] = ("a smoke run of the same upstream calls: no CUDA graph, no second "
                      "stream, no load on a CPU; every copy is ordered, so 0 stale")
    print(json.dumps(out), flush=True)
