"""A policy's state as plain data, to keep it in the log across control leader changes.

A state that is a dataclass of numbers, strings, booleans, None, tuples and nested such
dataclasses (``TurboServeState`` is) round-trips through msgpack by its fields' type hints;
any other state is not persisted (``encode`` gives None) and a new leader starts from the
policy's ``initial_state()``. Nothing is ever unpickled.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

import msgpack

__all__ = ["encode", "decode"]


def _plain(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, tuple):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    raise TypeError(f"{type(x).__name__} is not plain data")


def encode(state: Any) -> bytes | None:
    """The state as msgpack, or None when it is not plain data."""
    if not dataclasses.is_dataclass(state):
        return None
    try:
        return msgpack.packb(_plain(state), use_bin_type=True)
    except TypeError:
        return None


def _build(hint: Any, value: Any) -> Any:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return None
        return _build(next(a for a in args if a is not type(None)), value)
    if dataclasses.is_dataclass(hint):
        return _instance(hint, value)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_build(args[0], v) for v in value)
        return tuple(_build(a, v) for a, v in zip(args, value))
    if hint is float and isinstance(value, int):
        return float(value)
    return value


def _instance(cls: type, data: dict[str, Any]) -> Any:
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: _build(hints[k], v) for k, v in data.items() if k in known})


def decode(template: Any, blob: bytes) -> Any | None:
    """The state in ``blob``, built as ``type(template)``; None when it does not fit (a field
    of another type, another policy's state): the caller keeps its own."""
    try:
        return _instance(type(template), msgpack.unpackb(blob, raw=False))
    except Exception:  # a state written by another version or policy: not ours to use
        return None
