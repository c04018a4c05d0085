"""A recovery's inputs read back from the log beside the serving loop: the new owner keeps the
session and waits (no chunk, no input applied, no offload or handoff) until it has read them,
while the sessions it serves run on. The read raised out of the worker's loop before, and held
up every session it served while it ran (a review found both: a broker blip during a recovery
ended each survivor that took a recovered session, and the recoveries went on)."""

from __future__ import annotations

import asyncio
from typing import Any

from schemas.records import Assign, Claimed, CommandRejected, InputAccepted, InputPushed, Record, Suspend
from streams.generations_memory import MemoryGenerationStore
from streams.input_log import LoggedInput
from workers.commands import CommandHandler, Ports
from tests.workers.test_ownership_model import _Model


def test_a_recovery_whose_inputs_cannot_be_read_waits_for_them_then_applies_them() -> None:
    async def run() -> None:
        store = MemoryGenerationStore("t")
        await store.register_worker("w", 2)
        gen = await store.commit("s", 0, "w")
        sent: list[Record] = []
        away = [ConnectionError("broker away")] * 2
        log = [LoggedInput(0, i, InputPushed(session_id="s", seq=i, kind="text", payload=f"in {i}", ts=1.0))
               for i in (1, 2)]

        async def send(rec: Record) -> None:
            sent.append(rec)

        async def replay(sid: str, after: int, start: Any) -> list[Any]:
            if away:
                raise away.pop()
            return [got for got in log if got.record.seq > after]

        now = [10.0]
        h = CommandHandler(Ports(worker_id="w", device="cpu", store=store, model=_Model(), send=send,
                                 clock=lambda: now[0], monotonic=lambda: now[0], replay=replay))
        await h.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=0.0, restore=True, recover=True))
        sess = h.sessions["s"]
        assert sess.replay_owed and any(isinstance(r, Claimed) for r in sent)
        await asyncio.sleep(0)
        await h.replayed()  # the read failed: still owed
        assert sess.replay_owed and h.schedule.pop_due(now[0] + 60) == []  # no chunk without its inputs
        await h.handle(Suspend(worker_id="w", session_id="s", generation=gen, ts=0.0))
        refused = [r for r in sent if isinstance(r, CommandRejected)]
        assert [r.command for r in refused] == [Suspend.TAG] and "not read from session-inputs" in refused[0].detail
        assert "s" in h.sessions and sess.replay_owed  # the offload waits: its snapshot must hold every input
        now[0] += 5.0
        await h.expire_gaps()  # each heartbeat: read again, and now the broker answers
        await asyncio.sleep(0)
        await h.replayed()
        assert not sess.replay_owed and sess.executing
        assert [r.seq for r in sent if isinstance(r, InputAccepted)] == [1, 2]
        assert [sid for sid, _ in h.schedule.pop_due(now[0] + 1)] == ["s"]

    asyncio.run(run())


def test_the_sessions_a_worker_serves_run_on_while_a_recoverys_inputs_are_read() -> None:
    """A read of the log (a new consumer, up to 100,000 records) ran inside the serving loop,
    and 20 recovered sessions held up every session the worker served for 20 reads in a row."""

    async def run() -> None:
        store = MemoryGenerationStore("t")
        await store.register_worker("w", 4)
        served, recovered = await store.commit("a", 0, "w"), await store.commit("b", 0, "w")
        sent: list[Record] = []
        reading = asyncio.Event()

        async def send(rec: Record) -> None:
            sent.append(rec)

        async def replay(sid: str, after: int, start: Any) -> list[Any]:
            await reading.wait()  # a slow read
            return []

        h = CommandHandler(Ports(worker_id="w", device="cpu", store=store, model=_Model(), send=send,
                                 clock=lambda: 0.0, monotonic=lambda: 0.0, replay=replay))
        await h.handle(Assign(worker_id="w", session_id="a", generation=served, ts=0.0, prompt="p"))
        await asyncio.wait_for(h.handle(Assign(worker_id="w", session_id="b", generation=recovered, ts=0.0,
                                               restore=True, recover=True)), 1.0)  # handled without waiting for the read
        assert [sid for sid, _ in h.schedule.pop_due(1.0)] == ["a"]  # "a" runs on; "b" waits for its inputs
        reading.set()
        await asyncio.sleep(0)
        await h.replayed()
        assert [sid for sid, _ in h.schedule.pop_due(2.0)] == ["b"]

    asyncio.run(run())
