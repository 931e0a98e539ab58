"""One-shot facts about this GPU machine's torch that specrace's CUDA backend relies on
(kept in tools/ for GPU bring-up; prints one line per fact)."""
import sys

import torch

aten = torch.ops.aten


def fact(name, fn):
    try:
        print(f"{name}: ok {fn()!r}"[:300], flush=True)
    except Exception as exc:  # a fact is the error too
        print(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}", flush=True)


def probe(tag):
    cuda = torch.device("cuda")
    fact(f"{tag} empty(pin_memory=True)", lambda: torch.empty(4, pin_memory=True).is_pinned())
    fact(f"{tag} t.pin_memory()", lambda: torch.zeros(4).pin_memory().is_pinned())
    fact(f"{tag} tensor(pin_memory=True)", lambda: torch.tensor([1, 2], pin_memory=True).is_pinned())
    fact(f"{tag} aten._pin_memory(t, cuda)", lambda: aten._pin_memory.default(torch.zeros(4), cuda).data_ptr() > 0)
    fact(f"{tag} aten.is_pinned(t, cuda)", lambda: aten.is_pinned.default(aten._pin_memory.default(torch.zeros(4), cuda), cuda))
    fact(f"{tag} x.to(cpu, non_blocking).is_pinned", lambda: torch.ones(4, device=cuda).to("cpu", non_blocking=True).is_pinned())


probe("before-sim")
fact("gpu_trace api", lambda: [n for n in dir(torch.cuda._gpu_trace) if n.startswith("register")])
fact("memory snapshot api", lambda: [n for n in dir(torch.cuda.memory) if "history" in n or "trace" in n.lower()])
fact("attach_allocator_trace", lambda: [n for n in dir(torch._C) if "cuda" in n.lower() and ("trace" in n.lower() or "observer" in n.lower() or "History" in n)])
sys.path.insert(0, ".")
from harness.runtime import sim  # noqa: E402
sim.install()
probe("after-sim")
