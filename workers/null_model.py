"""``NullModel``: a ``StreamingModel`` that does no tensor work, for control-plane benchmarks.

Its state is a few scalars and its chunks carry no frames, so a worker driving it costs
the runtime's own bookkeeping and nothing else. Imports no torch.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from typing import Any

import msgpack

__all__ = ["NullModel", "NullState", "NullChunk"]


@dataclass(slots=True, eq=False)
class NullState:
    """The fields the worker runtime reads from a session state."""

    session_id: str
    prompt: str
    seed: int
    inputs: list[tuple[int, str]] = field(default_factory=list)
    input_seq: int = 0
    chunk_index: int = 0
    last_checksum: str = ""

    def to(self, device: Any) -> "NullState":
        """Nothing lives on a device; returns self (the runtime calls this on offload/restore)."""
        return self


@dataclass(frozen=True, slots=True)
class NullChunk:
    """A chunk without frames: what the runtime publishes in ``ChunkDone``."""

    session_id: str
    chunk_index: int
    input_seq: int
    checksum: str
    frames: None = None


class NullModel:
    """Advances chunk indices and records inputs; deterministic per session."""

    def init_state(self, session_id: str, prompt: str, seed: int) -> NullState:
        return NullState(session_id, prompt, seed)

    def apply_input(self, state: NullState, text: str, seq: int) -> None:
        state.inputs.append((seq, text))
        state.input_seq = seq

    def run_batch(self, states: list[NullState]) -> list[NullChunk]:
        out = []
        for s in states:
            token = f"{s.session_id}:{s.seed}:{s.chunk_index}:{s.input_seq}".encode()
            s.last_checksum = f"{zlib.crc32(token):08x}"
            out.append(NullChunk(s.session_id, s.chunk_index, s.input_seq, s.last_checksum))
            s.chunk_index += 1
        return out

    def export_state(self, state: NullState) -> dict[str, Any]:
        return {"session_id": state.session_id, "prompt": state.prompt, "seed": state.seed,
                "inputs": [list(i) for i in state.inputs], "input_seq": state.input_seq,
                "chunk_index": state.chunk_index, "last_checksum": state.last_checksum}

    def import_state(self, data: dict[str, Any]) -> NullState:
        return NullState(data["session_id"], data["prompt"], int(data["seed"]),
                         [(int(q), str(t)) for q, t in data["inputs"]], int(data["input_seq"]),
                         int(data["chunk_index"]), str(data["last_checksum"]))

    def state_nbytes(self, state: NullState) -> int:
        return len(msgpack.packb(self.export_state(state), use_bin_type=True))
