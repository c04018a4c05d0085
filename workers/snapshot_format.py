"""The session snapshot blob: the model's compact state and where its inputs stood.

A snapshot records, beside the model's exported state, the ``session-inputs`` position of
the last input applied, so a recovery replays exactly the inputs after it.
"""

from __future__ import annotations

from typing import Any

import msgpack

from schemas.errors import SnapshotCorruptError

__all__ = ["SNAPSHOT_FORMAT", "pack_snapshot", "unpack_snapshot"]

SNAPSHOT_FORMAT = "chunkserve.snapshot.v1"


def pack_snapshot(model: Any, state: Any, input_pos: tuple[int, int]) -> bytes:
    return msgpack.packb({"format": SNAPSHOT_FORMAT, "state": model.export_state(state),
                          "input_partition": input_pos[0], "input_offset": input_pos[1]},
                         use_bin_type=True)


def unpack_snapshot(model: Any, session_id: str, blob: bytes) -> tuple[Any, tuple[int, int]]:
    """The state (on the CPU) and input position in ``blob``; ``SnapshotCorruptError`` when
    it cannot be read."""
    try:
        data = msgpack.unpackb(blob, raw=False)
        if data.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown snapshot format {data.get('format')!r}")
        pos = (int(data["input_partition"]), int(data["input_offset"]))
        return model.import_state(data["state"]), pos
    except Exception as exc:
        raise SnapshotCorruptError(f"session {session_id}: unreadable snapshot: {exc}") from None
