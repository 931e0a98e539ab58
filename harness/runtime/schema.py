"""What an aten op reads and writes, from its schema's alias annotations (as CSAN does).

Cached per overload: the simulator asks this for every op it sees.
"""
from __future__ import annotations

import functools
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import torch


class OpEffects(NamedTuple):
    # (positional index or kwarg name, is_write) for every Tensor / Tensor[] argument
    tensor_args: Tuple[Tuple[Any, bool], ...]
    # for each return: the positional index / kwarg name of the argument it aliases, or None
    return_alias: Tuple[Optional[Any], ...]
    is_view: bool  # every return aliases an input that is not written: metadata only
    mutates: bool


@functools.cache  # once per overload: the simulator asks for every op it sees
def effects(func: Any) -> OpEffects:
    schema = func._schema
    tensor_args: List[Tuple[Any, bool]] = []
    alias_owner: Dict[str, Any] = {}
    for i, arg in enumerate(schema.arguments):
        key: Any = arg.name if arg.kwarg_only else i
        tname = str(arg.type)
        if "Tensor" in tname:
            write = bool(arg.alias_info is not None and arg.alias_info.is_write)
            tensor_args.append((key, write))
            if arg.alias_info is not None:
                for a in arg.alias_info.after_set | arg.alias_info.before_set:
                    alias_owner[a] = key
    ret_alias: List[Optional[Any]] = []
    view = bool(schema.returns)
    for ret in schema.returns:
        owner = None
        if ret.alias_info is not None:
            sets = ret.alias_info.before_set | ret.alias_info.after_set
            owner = next((alias_owner[a] for a in sets if a in alias_owner), None)
            if ret.alias_info.is_write:
                view = False
        else:
            view = False
        ret_alias.append(owner)
    mutates = any(w for _, w in tensor_args)
    return OpEffects(tuple(tensor_args), tuple(ret_alias), view and not mutates, mutates)


def arg_value(args: tuple, kwargs: dict, key: Any) -> Any:
    if isinstance(key, int):
        return args[key] if key < len(args) else None
    return kwargs.get(key)


def iter_tensors(value: Any):
    """The tensors in an argument value: a tensor, or a list/tuple of optional tensors."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, torch.Tensor):
                yield v
