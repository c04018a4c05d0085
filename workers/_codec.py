"""Plain-data pieces of the compact session snapshot: tensors as bytes, RNG as two counters.

Everything here returns or reads only str/int/bytes/lists/dicts, so ``msgpack`` can carry
it. Malformed input raises :class:`schemas.errors.SnapshotCorruptError`.
"""

from __future__ import annotations

import struct
from typing import Any

import torch
from torch import Tensor

from schemas.errors import SnapshotCorruptError

__all__ = [
    "KIND",
    "VERSION",
    "field",
    "pack_rng",
    "tensor_from_record",
    "tensor_to_record",
    "unpack_rng",
]

KIND = "chunkserve.reference-state"
VERSION = 1
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
_RNG = struct.Struct("<QQ")


def tensor_to_record(t: Tensor) -> dict[str, Any]:
    """``{"dtype", "shape", "data"}`` with the tensor's raw little-endian bytes."""
    name = str(t.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise ValueError(f"unsupported dtype {t.dtype}")
    host = t.detach().to("cpu").contiguous()
    return {"dtype": name, "shape": list(host.shape), "data": host.view(torch.uint8).numpy().tobytes()}


def tensor_from_record(rec: Any, name: str) -> Tensor:
    """Inverse of :func:`tensor_to_record`; checks dtype, shape and byte length."""
    dtype_name = field(rec, "dtype", str, name)
    shape = field(rec, "shape", list, name)
    data = field(rec, "data", bytes, name)
    if dtype_name not in _DTYPES or not all(isinstance(s, int) and s >= 0 for s in shape):
        raise SnapshotCorruptError(f"{name}: bad dtype {dtype_name!r} or shape {shape!r}")
    dtype = _DTYPES[dtype_name]
    numel = 1
    for s in shape:
        numel *= s
    if len(data) != numel * dtype.itemsize:
        raise SnapshotCorruptError(f"{name}: {len(data)} bytes do not fill {dtype_name} {shape}")
    if not data:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def pack_rng(seed: int, counter: int) -> bytes:
    """A counter-based RNG's whole state: 16 bytes, portable across devices."""
    return _RNG.pack(seed, counter)


def unpack_rng(data: bytes) -> tuple[int, int]:
    if len(data) != _RNG.size:
        raise SnapshotCorruptError(f"rng: expected {_RNG.size} bytes, got {len(data)}")
    return _RNG.unpack(data)


def field(rec: Any, key: str, typ: type, where: str = "state") -> Any:
    """``rec[key]`` if ``rec`` is a dict holding a value of ``typ`` there; else corrupt."""
    if not isinstance(rec, dict) or key not in rec:
        raise SnapshotCorruptError(f"{where}: missing field {key!r}")
    value = rec[key]
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise SnapshotCorruptError(f"{where}.{key}: expected {typ.__name__}, got {type(value).__name__}")
    return value
