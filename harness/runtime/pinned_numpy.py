"""Numpy views of pinned host memory, whose reads and writes are reported.

Servers stage their inputs in pinned buffers and take a numpy view of each *once*, at
construction (vLLM's ``CpuGpuBuffer.np``, ``InputBatch``'s ``*_cpu`` arrays), then read and
write the array every step. Torch never sees those accesses, so ``PinnedHostTensor``
alone cannot report them: ``.numpy()`` of a watched tensor therefore returns a
``PinnedArray`` -- the same memory, as an ndarray subclass that reports each access to
the run's recorder (``hostmem``), with the byte range it touched:

* taking a view (``a[2:5]``, ``a.reshape``) touches no data and reports nothing; the view
  is a ``PinnedArray`` too, so what is done through it later is reported;
* an element read (``a[3]``), a copy (fancy indexing, ``tolist``, ``item``, ``copy``,
  ``astype``, iteration, conversion) and every input of a ufunc or numpy function is a
  read; ``a[k] = v``, ``fill`` and every ufunc / numpy-function output (``out=``,
  ``np.copyto``'s destination, in-place operators) is a write.

Arrays a ufunc or numpy function *returns* are fresh memory, so plain ndarrays: only
memory that is pinned stays watched. Blind spot: ``np.asarray`` / ``np.array`` of a
watched array convert it in numpy's C code, which asks no Python hook -- the conversion's
read is unseen, and ``np.asarray`` hands back a plain view (docs/limits.md).
"""
from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import numpy as np

from seams.context import current
from harness.runtime.trace import user_frame

# How the watched memory is named to the recorder: (sid, name, storage base address).
Owner = Tuple[int, str, int]


def view_of(array: np.ndarray, owner: Owner) -> "PinnedArray":
    """``array`` (a numpy view of pinned memory ``owner``) as a ``PinnedArray``."""
    out = array.view(PinnedArray)
    out._owner = owner
    return out


def _span(a: np.ndarray) -> Tuple[int, int]:
    """Byte range ``[lo, hi)`` ``a`` covers, relative to its own first element."""
    if a.size == 0:
        return 0, 0
    lo = hi = 0
    for size, stride in zip(a.shape, a.strides):
        if size > 1:
            reach = (size - 1) * stride
            if reach < 0:
                lo += reach
            else:
                hi += reach
    return lo, hi + a.itemsize


def _note(a: "PinnedArray", write: bool) -> None:
    rec = current().recorder
    owner = a._owner
    if rec is None or owner is None:
        return
    sid, name, base = owner
    start = a.__array_interface__["data"][0] - base
    lo, hi = _span(a)
    rec((sid, start + lo, start + hi), write, name, user_frame(3))


def _plain(x: Any) -> Any:
    """``x`` with every ``PinnedArray`` in it (also inside tuples and lists) as a plain
    ndarray view, so numpy's own implementation runs without coming back here."""
    if isinstance(x, PinnedArray):
        return x.view(np.ndarray)
    if isinstance(x, (tuple, list)):
        return type(x)(_plain(v) for v in x)
    return x


def _watched(xs: Iterable[Any]) -> Iterable["PinnedArray"]:
    for x in xs:
        if isinstance(x, PinnedArray):
            yield x
        elif isinstance(x, (tuple, list)):
            yield from _watched(x)


# numpy functions that write their first argument (in place), beyond ``out=``
_WRITES_FIRST = {np.copyto, np.put, np.place, np.putmask, np.fill_diagonal}
if hasattr(np, "put_along_axis"):
    _WRITES_FIRST.add(np.put_along_axis)
# numpy functions that look at an array's layout, never its data (a view or a shape)
_LAYOUT_ONLY = {np.may_share_memory, np.shares_memory, np.shape, np.ndim, np.size,
                np.reshape, np.transpose, np.squeeze, np.expand_dims, np.broadcast_to,
                np.atleast_1d, np.atleast_2d, np.result_type}


class PinnedArray(np.ndarray):
    """An ndarray over watched pinned memory (see the module docstring)."""

    _owner: Optional[Owner] = None

    def __array_finalize__(self, obj: Any) -> None:
        # A view of a PinnedArray is over the same memory; a fresh array made from one
        # (``copy``, a ufunc result) is not, and is never returned as a PinnedArray.
        self._owner = getattr(obj, "_owner", None)

    # --- element access -------------------------------------------------------------
    def __getitem__(self, key: Any) -> Any:
        out = np.ndarray.__getitem__(self, key)
        if isinstance(out, PinnedArray) and out.base is not None and \
                np.may_share_memory(out.view(np.ndarray), self.view(np.ndarray)):
            return out  # a view: no data touched yet
        # an element or a copy (fancy indexing): a read of what was selected
        _note(self._selection(key), False)
        return out.view(np.ndarray) if isinstance(out, PinnedArray) else out

    def __setitem__(self, key: Any, value: Any) -> None:
        for src in _watched((value,)):
            _note(src, False)
        _note(self._selection(key), True)
        np.ndarray.__setitem__(self, key, _plain(value))

    def _selection(self, key: Any) -> "PinnedArray":
        """The part of ``self`` ``key`` selects, as a view when basic indexing names it,
        else ``self`` whole (a fancy index may touch any element: conservative)."""
        try:
            keys = key if isinstance(key, tuple) else (key,)
            if all(isinstance(k, (int, np.integer, slice)) or k is Ellipsis or k is None
                   for k in keys):
                return np.ndarray.__getitem__(self, keys + (Ellipsis,))
        except (IndexError, TypeError):
            pass
        return self

    # --- numpy's protocols ----------------------------------------------------------
    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        outs = kwargs.get("out") or ()
        for a in _watched(inputs):
            # ``a += 1`` passes ``a`` as input and output: a read, then the write below
            _note(a, False)
        for a in _watched(outs if isinstance(outs, tuple) else (outs,)):
            _note(a, True)
        if "out" in kwargs:
            kwargs["out"] = _plain(kwargs["out"])
        res = getattr(ufunc, method)(*_plain(inputs), **kwargs)
        if outs:  # in place: hand back the caller's arrays, as numpy does
            return outs[0] if len(outs) == 1 else outs
        return res

    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        if func in _LAYOUT_ONLY:  # numpy's own implementation; a view stays watched
            return super().__array_function__(func, types, args, kwargs)
        written = []
        if func in _WRITES_FIRST and args and isinstance(args[0], PinnedArray):
            written.append(args[0])
            read = [*_watched(args[1:]), *_watched(kwargs.values())]
        else:
            read = [*_watched(args), *_watched(v for k, v in kwargs.items() if k != "out")]
        if "out" in kwargs:
            written.extend(_watched((kwargs["out"],)))
        for a in read:
            _note(a, False)
        for a in written:
            _note(a, True)
        res = func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        return kwargs["out"] if "out" in kwargs and kwargs["out"] is not None else res

    # --- methods that read or write without a ufunc ---------------------------------
    def tolist(self) -> Any:
        _note(self, False)
        return np.ndarray.tolist(self)

    def item(self, *args: Any) -> Any:
        _note(self._selection(args[0] if len(args) == 1 else args) if args else self, False)
        return np.ndarray.item(self, *args)

    def copy(self, order: str = "C") -> np.ndarray:
        _note(self, False)
        return np.ndarray.copy(self.view(np.ndarray), order)

    def astype(self, *args: Any, **kwargs: Any) -> np.ndarray:
        _note(self, False)
        return np.ndarray.astype(self.view(np.ndarray), *args, **kwargs)

    def tobytes(self, order: str = "C") -> bytes:
        _note(self, False)
        return np.ndarray.tobytes(self, order)

    def fill(self, value: Any) -> None:
        _note(self, True)
        np.ndarray.fill(self, value)

    def __iter__(self):
        if self.ndim > 1:
            # rows are views over the same memory (MRv2 keeps one per request): no data
            # touched yet, each row reports its own reads and writes
            return (self[i] for i in range(self.shape[0]))
        _note(self, False)  # a 1-D array yields its elements: a read of them all
        return iter(self.view(np.ndarray))

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        # a conversion (``torch.tensor(a)``, ``np.array(a)``): the consumer reads it all
        _note(self, False)
        plain = self.view(np.ndarray)
        return plain if dtype is None else plain.astype(dtype)

    def __reduce__(self):  # a pickled copy is plain data, and reading it is a read
        _note(self, False)
        return self.view(np.ndarray).copy().__reduce__()
