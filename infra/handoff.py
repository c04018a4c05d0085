"""``chunkserve handoff SESSION TARGET``: an operator moves one live session to another worker.

The same path a rebalance takes: a ``Handoff`` to the session's owner, stamped with the
generation the store holds; the owner freezes the session at its next chunk boundary and
reports ``Frozen``, dispatch commits the move and the target restores it. Refused up front,
in one line, when the store shows it cannot be carried out (the session unknown, not
active, closing, waiting for a recovery or not claimed yet; the target unknown, down,
draining, full, or the owner already). Dispatch may still keep the session where it is
(the target filled meanwhile): the answer says whether the store shows it moved.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Mapping

from schemas.errors import ChunkserveError
from schemas.records import Handoff
from schemas.topics import WORKER_COMMANDS
from streams.config import Settings
from streams.generations import GenerationStore, SessionView, StoreState, WorkerLoad
from streams.kafka import RecordProducer
from streams.topics import require_topics

__all__ = ["handoff_refusal", "hand_off"]

POLL_S = 0.2


def handoff_refusal(view: SessionView | None, loads: Mapping[str, WorkerLoad], sid: str,
                    target: str) -> str | None:
    """Why ``sid`` cannot be handed to ``target`` as the store stands, or None."""
    if view is None:
        return f"session {sid} is not known to the store (never opened, or closed past its retention)"
    gen = view.generation
    if view.state != StoreState.ACTIVE:
        return f"session {sid} is {view.state.value}: only an active session moves (an offloaded one is placed when its user returns)"
    if view.close_requested:
        return f"session {sid} is closing"
    if view.stranded:
        return f"session {sid} lost its owner {gen.worker_id}: the recovery places it"
    if not view.claimed:
        return f"session {sid} is not claimed yet by {gen}; try again in a moment"
    if target == gen.worker_id:
        return f"session {sid} is on {target} already"
    load = loads.get(target)
    if load is None:
        known = ", ".join(sorted(loads))[:200] or "none"
        return f"worker {target} is not registered (registered: {known})"
    if load.down:
        return f"worker {target} is down"
    if load.draining:
        return f"worker {target} is draining"
    if load.used >= load.capacity:
        return f"worker {target} is full ({load.used} of {load.capacity} slots)"
    return None


async def hand_off(settings: Settings, sid: str, target: str, wait_s: float = 30.0,
                   monotonic: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Send the session's owner a ``Handoff`` to ``target``; then, for up to ``wait_s``, read
    the store until a newer generation is claimed. ChunkserveError (one line) when refused."""
    await require_topics(settings, [WORKER_COMMANDS], "handoff")  # on another prefix: one line at once
    store = GenerationStore.from_settings(settings)
    try:
        view = await store.session(sid)
        why = handoff_refusal(view, await store.load_view(), sid, target)
        if why is not None:
            raise ChunkserveError(f"handoff refused: {why}")
        assert view is not None
        gen = view.generation
        async with RecordProducer(settings, client_id="handoff") as producer:
            await producer.send(Handoff(worker_id=gen.worker_id, session_id=sid, generation=gen,
                                        target_worker=target, ts=time.time(), reason="operator"))
        start = monotonic()
        now = view
        while monotonic() - start < wait_s:
            now = await store.session(sid)
            if now is None or now.state != StoreState.ACTIVE or (now.generation.epoch > gen.epoch and now.claimed):
                break
            await asyncio.sleep(POLL_S)
        moved = (now is not None and now.generation.worker_id == target and now.claimed
                 and now.generation.epoch > gen.epoch)
        return {"session": sid, "from": str(gen), "to": target, "moved": moved,
                "now": None if now is None else f"{now.generation} ({now.state.value})",
                "waited_s": round(monotonic() - start, 2)}
    finally:
        await store.aclose()
