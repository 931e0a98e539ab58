"""The simulated device's caching allocator: PyTorch's semantics, as server code meets them.

* A block belongs to the stream that was current when it was allocated (its *home*), and
  only allocations on that stream ever get it again.
* A storage is freed on the host when the last tensor or view on it dies. Python's
  reference counting makes that a deterministic point of the program: the storage's
  ``Storage`` handle (held by every wrapper on it -- never by queued kernels, which hold
  the raw memory, exactly as a CUDA kernel holds a pointer) is finalised there. The block
  goes back to its home pool at once, so the next fitting allocation on that stream gets
  it while kernels on other streams may still be reading it: the bug class
  ``record_stream`` exists for.
* ``record_stream(s)`` defers that: the free notes the position every recorded stream has
  reached, and the block stays out of the pool until all of them have executed (PyTorch
  records an event per stream at the free and reuses the block once they completed).
  Recording the home stream is a no-op, as in PyTorch.
* Fit: a request rounds up to 512 bytes and takes the smallest cached block of its
  stream's pool that is large enough; of several, the one freed last. (PyTorch takes the
  lowest address, which may or may not be the block just freed; last-freed-first makes a
  block freed too early the first one handed out again, so the bug shows at the first
  chance -- an amplification, like poison.) Blocks are never split or merged: what
  matters here is *that* a block comes back, and to whom.
* A fresh block is poisoned; a reused one holds whatever its last owner left there, so
  ``torch.empty`` on it reads the old data, and a stale kernel of the old owner reads or
  overwrites the new owner's.

Blocks allocated while a CUDA graph is being captured belong to the graph's private pool:
its replays write them, so no ordinary allocation ever gets one (PyTorch's graph pools).
Several graphs sharing one pool, and reuse inside a pool, are not modelled.

A free the cyclic garbage collector finds (a storage kept alive by a reference cycle) is
not returned to any pool: *when* the collector runs is not a property of the program, and
handing the block out at that point would make the simulator's schedule depend on it.
``leaked`` counts them.
"""
from __future__ import annotations

import bisect
import gc
import weakref
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from harness.runtime import hostmem
from harness.runtime.trace import AllocRecord, Frame, FreeRecord, Position, RecordStreamRecord, user_frame

ROUND = 512  # PyTorch rounds every request to a multiple of 512 bytes
_POISON_BYTE = 0x5A
_POISON_INT = 0x5A5A5A5A
# a free that waits for nothing (the common one): one shared, immutable value, not a fresh
# list per free that the cyclic collector would keep walking for the trace's lifetime
_NO_WAITS: Tuple[Position, ...] = ()
_VIEWS_PER_BLOCK = 8  # cached dense views a block keeps (``Block.views``)
# dtypes whose poison is the 0x5A byte pattern itself: a fresh block needs no second fill
_BYTE_POISON = {torch.uint8, torch.int8, torch.int16, torch.int32}


def poison_fill(t: torch.Tensor) -> torch.Tensor:
    """What uninitialised memory reads as. Loud: NaN for floats, a huge positive int (an
    out-of-range token id), True for bools."""
    if t.numel() == 0:
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    elif t.dtype in (torch.uint8, torch.int8):
        t.fill_(_POISON_BYTE)
    elif t.dtype == torch.int16:
        t.fill_(0x5A5A)
    else:
        t.fill_(_POISON_INT)
    return t


_IN_GC = False


def _gc_phase(phase: str, info: dict) -> None:
    global _IN_GC
    _IN_GC = phase == "start"


def watch_collector() -> None:
    """Have the collector say when it runs (``_IN_GC``): once per process, at install."""
    if _gc_phase not in gc.callbacks:
        gc.callbacks.append(_gc_phase)


# ``torch.inference_mode``: device memory is never an inference tensor (``_device_memory``)
_InferenceMode = torch._C._InferenceMode
_inference_mode = torch.is_inference_mode_enabled


def _device_memory(size: int, written: int) -> torch.Tensor:
    """A fresh block's memory: poison, but for the first ``written`` bytes, which the
    caller overwrites at once (a fresh output moved in: filling them first would only cost
    a second pass).

    Never an inference tensor, though the block may be made inside
    ``torch.inference_mode``: device memory outlives the mode, and kernels (and the next
    owner of the block) write it in place after it -- which torch refuses for inference
    tensors. The mode's rules are the host program's, and apply to the wrappers."""
    with _InferenceMode(False):
        if written:
            mem = torch.empty((size,), dtype=torch.uint8)
            if written < size:
                mem[written:].fill_(_POISON_BYTE)
            return mem
        return torch.full((size,), _POISON_BYTE, dtype=torch.uint8)


class Block:
    __slots__ = ("bid", "size", "mem", "typed", "views", "home", "owner", "graph", "taken")

    def __init__(self, bid: int, size: int, home: int, graph: bool = False,
                 written: int = 0) -> None:
        self.bid = bid
        self.size = size
        self.mem = _device_memory(size, written)
        # a dense result whose memory the block took instead of a copy (``storage``);
        # ``mem`` is None meanwhile, made from it when another layout asks (``_typed``)
        self.taken: Optional[torch.Tensor] = None
        self.typed: Dict[torch.dtype, torch.Tensor] = {}  # mem viewed as each dtype asked
        # (dtype, shape, stride) -> a view of mem from its start (``storage``): a block
        # mostly goes to the same kind of tensor again, and making the view is the dearest
        # step of a placement. Owners one after another may share the view object: nothing
        # restrides a device buffer in place (``inplace_view`` re-aliases it first).
        self.views: Dict[tuple, torch.Tensor] = {}
        self.home = home  # stream id
        self.owner: Optional[int] = None  # sid of the storage that holds (or last held) it
        # allocated during a CUDA graph capture: the graph's private pool, which ordinary
        # allocations never get -- its replays keep writing there
        self.graph = graph


class Storage:
    """One storage's hold on its block; finalised when the last wrapper on it dies.
    ``access`` is the first tensor's ``(sid, lo, hi)``, known here without asking the
    tensor (the detector's access of every kernel output)."""

    __slots__ = ("allocator", "block", "sid", "streams", "access")

    def __init__(self, allocator: "SimAllocator", block: Block, sid: int,
                 access: Tuple[int, int, int]) -> None:
        self.allocator = allocator
        self.block = block
        self.sid = sid
        self.streams: Optional[Set[int]] = None  # record_stream'ed streams other than home
        self.access = access

    def __del__(self) -> None:
        """The free: the last wrapper on the storage died. (The allocator's side of it is
        here, not in a method of the allocator: one Python frame less, for every op.)"""
        try:
            allocator = self.allocator
            if not allocator.open:
                return
            if _IN_GC:
                allocator.leaked += 1
                return
            block = self.block
            if block.graph:
                return  # stays the graph's: a later replay writes it
            if self.streams:  # record_stream'ed: the block may have to wait for those
                streams = allocator.dev.streams
                waits = [(s, streams[s].enq) for s in sorted(self.streams)
                         if streams[s].enq > 0]
            else:
                waits = _NO_WAITS
            allocator.trace.add(FreeRecord(block.bid, self.sid, block.home, waits,
                                           user_frame(2)))
            if waits and not _passed(allocator.dev.streams, waits):
                allocator.deferred.append((block, waits))
            else:
                allocator._cache(block)
        except Exception:  # interpreter shutdown: modules half torn down
            pass


def _passed(streams: List, waits: Sequence[Position]) -> bool:
    """Has every recorded stream executed the position it had reached at the free (the
    block may be handed out again)?"""
    return all(streams[s].done >= n for s, n in waits)


def _typed(block: Block, dtype: torch.dtype) -> torch.Tensor:
    """The block's memory viewed as ``dtype`` (a block mostly gets the same dtype again:
    viewed once)."""
    typed = block.typed.get(dtype)
    if typed is None:
        # (a dtype view made inside ``torch.inference_mode`` would be an inference tensor)
        with _InferenceMode(False):
            if block.taken is not None:
                block.mem = block.taken.reshape(-1).view(torch.uint8)
                block.taken = None
            typed = block.typed[dtype] = block.mem.view(dtype)
    return typed


def _extent(shape, stride, offset: int) -> int:
    """Elements of storage a layout reaches (0 for an empty tensor)."""
    span = 1
    for size, st in zip(shape, stride):
        if size == 0:
            return 0
        span += (size - 1) * st
    return offset + span


class SimAllocator:
    def __init__(self, dev) -> None:
        # weak, as a stream's hold on its device: the device holds its allocator (why no
        # cycle may hold a session: ``sim._gc_frozen``)
        self._devref = weakref.ref(dev)
        self.trace = dev.trace
        # home stream id -> (sorted sizes, size -> stack of cached blocks)
        self.pools: Dict[int, Tuple[List[int], Dict[int, List[Block]]]] = {}
        self.deferred: List[Tuple[Block, List[Position]]] = []  # awaiting recorded streams
        self.blocks = 0
        self.open = True
        self.leaked = 0
        self._sids = hostmem.sid_source()  # the session's storage ids (the device's run)

    @property
    def dev(self):
        return self._devref()

    # --- allocation -----------------------------------------------------------------
    def storage(self, shape, stride, dtype: torch.dtype, frame: Optional[Frame],
                offset: int = 0, poison: bool = True, nbytes: Optional[int] = None,
                dense: bool = False, result: Optional[torch.Tensor] = None,
                op: Optional[str] = None) -> Tuple[torch.Tensor, Optional[Storage]]:
        """A tensor of this layout in a block of the current stream's pool, and its
        storage handle (None for an empty tensor: no block, as PyTorch's nullptr).
        ``nbytes``: the bytes the layout reaches, when the caller knows them; ``dense``: the
        layout is contiguous from offset 0 and the caller writes all of it at once;
        ``result``: the dense CPU tensor it will write, which the block may take instead
        (the tensor returned is then ``result`` itself: nothing to copy); ``op``: the op
        whose output it is, naming the storage in reports (``AllocRecord``)."""
        if nbytes is None:
            nbytes = _extent(shape, stride, offset) * dtype.itemsize
        if nbytes == 0:
            with _InferenceMode(False):  # device memory: never an inference tensor
                return torch.empty_strided(shape, stride, dtype=dtype), None
        dev = self._devref()
        home = dev.current.sid
        size = -(-nbytes // ROUND) * ROUND
        written = nbytes if dense else 0
        capture = dev.capture
        if capture is not None and capture.takes(home):
            # A captured op's output lives in the graph's private pool (as CUDA's graph
            # pools): fresh, and never handed to an ordinary allocation after a free.
            self.blocks += 1
            block, reused = Block(self.blocks, size, home, True, written), False
        else:
            # an exact fit (most allocations) is the smallest fit: taken here, without a
            # search; ``_take`` does the rest
            pool = None if self.deferred else self.pools.get(home)
            stack = pool[1].get(size) if pool is not None else None
            if stack:
                block, reused = stack.pop(), True
            else:
                block, reused = self._take(home, size, written)
        if poison and not reused and dtype not in _BYTE_POISON:
            poison_fill(_typed(block, dtype)[:nbytes // dtype.itemsize])
        if (result is not None and reused and block.size == nbytes and not dev.queued
                and not dev.captured and not _inference_mode()):
            # A dense result filling the whole block: the block takes the result's memory
            # instead of a copy of it (a kernel's fresh output, ``OpInfo.returns_fresh``
            # by its schema, shares memory with nothing). The block's old memory is then
            # unreachable -- nothing is queued on any stream (no pending kernel holds it)
            # and no graph was ever captured (no replay will) -- so every later reader
            # sees what the copy would have left. (Not a result computed inside
            # ``torch.inference_mode``, just now: an inference tensor is no device memory,
            # ``_device_memory``.)
            block.taken = result
            block.mem = None
            block.typed.clear()
            views = block.views
            views.clear()
            buf = views[(dtype, shape, stride)] = result
        elif offset:
            buf = _typed(block, dtype).as_strided(shape, stride, offset)
        else:  # the commonest layout: its view made once per block (``Block.views``)
            key = (dtype, shape, stride)
            buf = block.views.get(key)
            if buf is None:
                if len(block.views) >= _VIEWS_PER_BLOCK:
                    block.views.clear()
                buf = block.views[key] = _typed(block, dtype).as_strided(shape, stride, 0)
        sid = next(self._sids)
        self.trace.add(AllocRecord(block.bid, sid, home, nbytes, frame,
                                   block.owner if reused else None, op, dtype, shape))
        block.owner = sid
        # strides are never negative: the layout covers [offset, nbytes) of the block
        lo = offset * dtype.itemsize if offset else 0
        return buf, Storage(self, block, sid, (sid, lo, nbytes))

    def adopt(self, result: torch.Tensor, frame: Optional[Frame], op: Optional[str] = None
              ) -> Tuple[torch.Tensor, Optional[Storage]]:
        """A kernel's result (computed in fresh CPU memory) moved into a block. (The
        common contiguous result takes ``tensor.adopt``'s shorter way to ``storage``.)"""
        offset = result.storage_offset()
        stride = result.stride()
        if result.numel() > 1 and 0 in stride:  # an expanded layout cannot be written to
            result = result.contiguous()
            stride = result.stride()
            offset = 0
        buf, st = self.storage(result.shape, stride, result.dtype, frame, offset,
                               poison=False, op=op)
        if st is not None:
            buf.copy_(result)
        return buf, st

    def _take(self, home: int, size: int, written: int) -> Tuple[Block, bool]:
        """A block of at least ``size`` bytes from the pool of ``home``, once the deferred
        blocks whose recorded streams have passed are back, else a fresh one; and whether
        it was reused. (``storage`` takes an exact fit before asking.)"""
        if self.deferred:
            self._process_deferred()
        pool = self.pools.get(home)
        if pool is not None:
            sizes, stacks = pool
            # The smallest cached size that fits. A size class a take empties stays listed
            # (the next free of that size mostly refills it: no list surgery per op); the
            # search drops the empty ones it meets.
            i = bisect.bisect_left(sizes, size)
            while i < len(sizes):
                stack = stacks[sizes[i]]
                if stack:
                    return stack.pop(), True
                del stacks[sizes.pop(i)]
        self.blocks += 1
        return Block(self.blocks, size, home, written=written), False

    def _process_deferred(self) -> None:
        streams = self.dev.streams
        waiting = []
        for block, waits in self.deferred:
            if _passed(streams, waits):
                self._cache(block)
            else:
                waiting.append((block, waits))
        self.deferred = waiting

    def _cache(self, block: Block) -> None:
        pool = self.pools.get(block.home)
        if pool is None:
            pool = self.pools[block.home] = ([], {})
        sizes, stacks = pool
        stack = stacks.get(block.size)
        if stack is None:
            stack = stacks[block.size] = []
            bisect.insort(sizes, block.size)
        stack.append(block)

    # --- record_stream (the free itself: ``Storage.__del__``) ----------------------------
    def record_stream(self, st: Storage, stream, frame: Optional[Frame]) -> None:
        self.trace.add(RecordStreamRecord(st.sid, stream.sid, frame))
        if stream.sid != st.block.home:
            if st.streams is None:
                st.streams = set()
            st.streams.add(stream.sid)

    def empty_cache(self) -> None:
        """Release every cached block: later allocations get fresh (poisoned) ones. Blocks
        still awaiting their recorded streams stay where they are (PyTorch would wait for
        their events here; the simulator adds no hidden host sync)."""
        self.pools.clear()

    def close(self) -> None:
        """The session ended: frees from now on (tensors outliving it) are no-ops."""
        self.open = False
        self.pools.clear()
        self.deferred.clear()
