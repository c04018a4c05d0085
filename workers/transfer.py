"""Device-to-device migration of a session's full state over torch.distributed.

Point-to-point ``send``/``recv`` between two worker ranks: NCCL moves GPU tensors directly
between devices, gloo does the same on CPUs, with the same code. The full state moves —
the compact part (context latents, inputs, RNG, chunk index) as bytes, and the KV cache as a
tensor — so the target skips the KV recompute that the portable Redis path pays. The
generation commit, not this transfer, still decides who owns the session.
"""

from __future__ import annotations

from typing import Any

import msgpack
import torch
import torch.distributed as dist

__all__ = ["send_state", "recv_state", "backend_for"]


def backend_for(device: torch.device | str) -> str:
    """NCCL for CUDA devices, gloo otherwise."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def _bytes_tensor(data: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _send_bytes(data: bytes, dst: int, device: torch.device, group: Any) -> None:
    dist.send(torch.tensor([len(data)], dtype=torch.int64, device=device), dst, group=group)
    dist.send(_bytes_tensor(data, device), dst, group=group)


def _recv_bytes(src: int, device: torch.device, group: Any) -> bytes:
    size = torch.zeros(1, dtype=torch.int64, device=device)
    dist.recv(size, src, group=group)
    buf = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    dist.recv(buf, src, group=group)
    return buf.cpu().numpy().tobytes()


def send_state(model: Any, state: Any, dst: int, group: Any = None) -> int:
    """Send ``state`` (frozen at a chunk boundary) to rank ``dst``; returns the bytes moved."""
    device = state.device
    blob = msgpack.packb(model.export_state(state), use_bin_type=True)
    kv = state.kv
    header = msgpack.packb({"kv_shape": list(kv.shape) if kv is not None else None,
                            "kv_dtype": str(kv.dtype).removeprefix("torch.") if kv is not None else ""})
    _send_bytes(header, dst, device, group)
    _send_bytes(blob, dst, device, group)
    moved = len(header) + len(blob)
    if kv is not None:
        dist.send(kv.contiguous(), dst, group=group)
        moved += kv.numel() * kv.element_size()
    return moved


def recv_state(model: Any, src: int, group: Any = None) -> Any:
    """Receive a state from rank ``src`` onto ``model``'s device, KV cache included."""
    device = torch.device(model.device)
    header = msgpack.unpackb(_recv_bytes(src, device, group), raw=False)
    data = msgpack.unpackb(_recv_bytes(src, device, group), raw=False)
    kv = None
    if header["kv_shape"] is not None:
        kv = torch.empty(header["kv_shape"], dtype=getattr(torch, header["kv_dtype"]), device=device)
        dist.recv(kv, src, group=group)
    return model.import_state(data, kv=kv)
