"""Session snapshots: the blob (the model's compact state and where its inputs stood), and
taking or restoring one through the store.

A snapshot records, beside the model's exported state, the ``session-inputs`` position of
the last input applied, so a recovery replays exactly the inputs after it.
"""

from __future__ import annotations

from typing import Any, MutableMapping

import msgpack

from schemas.errors import SnapshotCorruptError

__all__ = ["SNAPSHOT_FORMAT", "pack_snapshot", "unpack_snapshot", "take", "restore"]

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


async def take(store: Any, model: Any, sid: str, held: Any) -> Any:
    """A fenced snapshot of ``held`` at a chunk boundary; returns the manifest."""
    return await store.put_snapshot(sid, held.generation, pack_snapshot(model, held.state, held.input_pos),
                                    chunk_index=held.state.chunk_index, input_seq=held.state.input_seq)


async def restore(store: Any, model: Any, device: str, sid: str,
                  host_cache: MutableMapping[str, tuple[str, Any, tuple[int, int]]]) -> tuple[Any, tuple[int, int]] | None:
    """The session's last snapshot on ``device`` and its input position: from host memory
    when it holds that snapshot, else from the store; None when it was never snapshotted."""
    view = await store.session(sid)
    manifest = view.snapshot if view is not None else None
    if manifest is None:
        return None
    cached = host_cache.pop(sid, None)
    if cached is not None and cached[0] == manifest.snap_id:
        return cached[1].to(device), cached[2]
    got = await store.read_snapshot(sid)
    if got is None:
        raise SnapshotCorruptError(f"session {sid}: snapshot vanished")
    state, pos = unpack_snapshot(model, sid, got[1])
    return state.to(device), pos
