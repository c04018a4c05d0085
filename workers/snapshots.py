"""Session snapshots: the blob (the model's compact state and where its inputs stood), and
taking or restoring one through the store.

A snapshot records, beside the model's exported state, the ``session-inputs`` position of
the last input applied, so a recovery replays exactly the inputs after it, and the seqs given
up on after the gap wait (a later arrival of one is refused as late by whichever generation
holds the session then, not taken for a duplicate of one applied).
"""

from __future__ import annotations

from typing import Any, Iterable, MutableMapping

import msgpack

from schemas.errors import SnapshotCorruptError
from streams.store_ops import MAX_SKIPPED

__all__ = ["SNAPSHOT_FORMAT", "pack_snapshot", "unpack_snapshot", "take", "restore"]

SNAPSHOT_FORMAT = "chunkserve.snapshot.v1"

# what a restore gives back: the state, the input position and the seqs given up on
Restored = tuple[Any, tuple[int, int], tuple[int, ...]]


def pack_snapshot(model: Any, state: Any, input_pos: tuple[int, int], skipped: Iterable[int] = ()) -> bytes:
    return msgpack.packb({"format": SNAPSHOT_FORMAT, "state": model.export_state(state),
                          "input_partition": input_pos[0], "input_offset": input_pos[1],
                          "skipped": sorted(skipped)[-MAX_SKIPPED:]},
                         use_bin_type=True)


def unpack_snapshot(model: Any, session_id: str, blob: bytes) -> Restored:
    """The state (on the CPU), input position and seqs given up on in ``blob`` (none in a
    snapshot taken before they were kept); ``SnapshotCorruptError`` when it cannot be read."""
    try:
        data = msgpack.unpackb(blob, raw=False)
        if data.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"unknown snapshot format {data.get('format')!r}")
        pos = (int(data["input_partition"]), int(data["input_offset"]))
        skipped = tuple(int(seq) for seq in data.get("skipped", ()))[-MAX_SKIPPED:]
        return model.import_state(data["state"]), pos, skipped
    except Exception as exc:
        raise SnapshotCorruptError(f"session {session_id}: unreadable snapshot: {exc}") from None


async def take(store: Any, model: Any, sid: str, held: Any) -> Any:
    """A fenced snapshot of ``held`` at a chunk boundary; returns the manifest."""
    return await store.put_snapshot(sid, held.generation, pack_snapshot(model, held.state, held.input_pos, held.skipped),
                                    chunk_index=held.state.chunk_index, input_seq=held.state.input_seq)


async def restore(store: Any, model: Any, device: str, sid: str,
                  host_cache: MutableMapping[str, tuple[str, Restored]]) -> Restored | None:
    """The session's last snapshot on ``device``, its input position and the seqs given up
    on: from host memory when it holds that snapshot, else from the store; None when it was
    never snapshotted."""
    view = await store.session(sid)
    manifest = view.snapshot if view is not None else None
    if manifest is None:
        return None
    cached = host_cache.pop(sid, None)
    if cached is not None and cached[0] == manifest.snap_id:
        state, pos, skipped = cached[1]
        return state.to(device), pos, skipped
    got = await store.read_snapshot(sid)
    if got is None:
        raise SnapshotCorruptError(f"session {sid}: snapshot vanished")
    state, pos, skipped = unpack_snapshot(model, sid, got[1])
    return state.to(device), pos, skipped
