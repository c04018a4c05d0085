"""A model of your own behind the worker, the smallest real one to copy:

    PYTHONPATH=. chunkserve worker --worker-id w0 --model examples.models.walk:LatentWalk
    CHUNKSERVE_WORKER_MODEL=examples.models.walk:LatentWalk chunkserve up   # the provisioner's workers

Each session keeps a latent grid of small integers. A chunk mixes it through a fixed matrix,
adds noise drawn from the session's own seed and chunk index, and renders two frames from
it; an input's text shifts the grid. Every value is an integer below 2^24 held in float32,
so the batched product is exact whatever the batch, the summation order or the device:
a session's chunks depend on that session alone, as the worker's contract asks (a restored
or migrated session goes on with the same frames it would have made where it was).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch

from workers.model import ChunkOutput

_SIDE = 8  # the latent grid is _SIDE x _SIDE
_LEVELS = 16  # values 0..15
_UP = 4  # each latent cell is a _UP x _UP block of pixels


@dataclass(slots=True, eq=False)
class WalkState:
    """What the worker reads (``input_seq``, ``chunk_index``, ``to``), plus the grid."""

    session_id: str
    seed: int
    latent: torch.Tensor  # [_SIDE * _SIDE] float32, integer values in 0.._LEVELS - 1
    input_seq: int = 0
    chunk_index: int = 0

    def to(self, device: torch.device | str) -> "WalkState":
        self.latent = self.latent.to(device)
        return self

    @property
    def device(self) -> torch.device:
        return self.latent.device


def _text_shift(text: str) -> torch.Tensor:
    digest = hashlib.sha256(text.encode()).digest() * 2  # 64 bytes, one per latent cell
    return torch.tensor([b % _LEVELS for b in digest[: _SIDE * _SIDE]], dtype=torch.float32)


class LatentWalk:
    """A ``workers.model.StreamingModel``; ``device`` is where the batch runs."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        g = torch.Generator().manual_seed(0)
        self.mix = torch.randint(0, _LEVELS, (_SIDE * _SIDE, _SIDE * _SIDE), generator=g).float().to(self.device)

    def init_state(self, session_id: str, prompt: str, seed: int) -> WalkState:
        return WalkState(session_id, seed, _text_shift(prompt).to(self.device))

    def apply_input(self, state: WalkState, text: str, seq: int) -> None:
        state.latent = torch.remainder(state.latent + _text_shift(text).to(state.latent.device), _LEVELS)
        state.input_seq = seq

    def run_batch(self, states: list[WalkState]) -> list[ChunkOutput]:
        x = torch.stack([s.latent.to(self.device) for s in states])
        noise = torch.stack([self._noise(s) for s in states]).to(self.device)
        x = torch.remainder(x @ self.mix + noise, _LEVELS)  # exact: every sum is below 2^24
        frames = self._render(x).cpu()
        out = []
        for s, latent, f in zip(states, x, frames):
            s.latent = latent.to(s.latent.device)
            out.append(ChunkOutput(s.session_id, s.chunk_index, s.input_seq, f,
                                   hashlib.sha256(f.numpy().tobytes()).hexdigest()))
            s.chunk_index += 1
        return out

    def export_state(self, state: WalkState) -> dict[str, object]:
        return {"session_id": state.session_id, "seed": state.seed, "input_seq": state.input_seq,
                "chunk_index": state.chunk_index, "latent": [int(v) for v in state.latent.cpu().tolist()]}

    def import_state(self, data: dict[str, object]) -> WalkState:
        latent = torch.tensor(data["latent"], dtype=torch.float32)
        if latent.shape != (_SIDE * _SIDE,) or not bool(((latent >= 0) & (latent < _LEVELS)).all()):
            raise ValueError("not a LatentWalk state")
        return WalkState(str(data["session_id"]), int(data["seed"]), latent,  # type: ignore[call-overload]
                         int(data["input_seq"]), int(data["chunk_index"]))  # type: ignore[call-overload]

    def state_nbytes(self, state: WalkState) -> int:
        return 4 * state.latent.numel() + 64

    def _noise(self, state: WalkState) -> torch.Tensor:
        g = torch.Generator().manual_seed((state.seed * 1_000_003 + state.chunk_index) % (1 << 63))
        return torch.randint(0, _LEVELS, (_SIDE * _SIDE,), generator=g).float()

    def _render(self, x: torch.Tensor) -> torch.Tensor:
        """Two frames per chunk, uint8 [B, 2, H, W, 3]: the grid, then its complement."""
        grid = x.reshape(-1, 1, _SIDE, _SIDE) * (256 // _LEVELS)
        img = torch.nn.functional.interpolate(grid, scale_factor=_UP, mode="nearest")  # [B,1,H,W]
        rgb = img.permute(0, 2, 3, 1).expand(-1, -1, -1, 3)
        return torch.stack([rgb, 255 - rgb], dim=1).to(torch.uint8)
