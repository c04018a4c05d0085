"""A worker holds its id alone: a second start under a live worker's id is refused before it
touches the store's sessions; a worker whose id another process took stops without saying
WorkerDown for it; a clean stop frees the id.

The store's in-memory twin and the real runtime (no broker: the refusal comes first; the
stop's events go to a recorder)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from schemas.errors import ConfigError, LeaseHeldError
from schemas.records import Record, WorkerDown
from streams.config import Settings
from streams.generations_memory import MemoryGenerationStore
from workers.null_model import NullModel
from workers.outbox import Outbox
from workers.runtime import Worker, WorkerConfig

from tests.workers.test_input_order import Recorder  # the producer that keeps what a worker sends


def _worker(store: MemoryGenerationStore, **config: Any) -> Worker:
    ticks = itertools.count(0.0, 2.0)  # each look at the clock 2 s on: a short real wait
    return Worker(Settings(), WorkerConfig(worker_id="w1", capacity=2, **config), NullModel(), store,
                  clock=lambda: 1000.0, monotonic=lambda: next(ticks))


def test_the_lease_time_is_never_under_three_heartbeats() -> None:
    assert WorkerConfig(worker_id="w").lease_ttl_s == 5.0
    assert WorkerConfig(worker_id="w", heartbeat_s=2.0).lease_ttl_s == 6.0
    assert WorkerConfig(worker_id="w", lease_s=0.1, heartbeat_s=0.1).lease_ttl_s == pytest.approx(0.3)


def test_a_second_start_with_a_live_workers_id_is_refused_and_strands_nothing() -> None:
    async def run() -> tuple[LeaseHeldError, Any, Any]:
        store = MemoryGenerationStore("ns")
        await store.register_worker("w1", 2)
        gen = await store.commit("s1", 0, "w1")  # the live worker's session
        live = _worker(store)
        await live.lease.take()
        second = _worker(store)
        with pytest.raises(LeaseHeldError) as info:
            await second.start()
        return info.value, await store.recovery_due(1e12), (await store.session("s1"), gen)

    err, due, (view, gen) = asyncio.run(run())
    line = str(err)
    assert isinstance(err, ConfigError) and "\n" not in line
    assert line.startswith("worker id w1 is held by another live worker (")
    assert "give each worker its own id" in line and "within 5 s" in line
    assert err.key == "worker:w1" and err.holder in line
    assert due == (0, [])  # nothing queued for recovery
    assert view.generation == gen and not view.stranded


def test_a_worker_whose_id_was_taken_stops_without_saying_workerdown() -> None:
    async def run() -> tuple[bool, LeaseHeldError | None, list[Record], str]:
        store = MemoryGenerationStore("ns")
        worker = _worker(store, heartbeat_s=0.02, lease_s=0.06)
        out = Recorder()
        worker.outbox = Outbox(out, "worker w1")
        await worker.lease.take()
        key = store.keys.lease("worker:w1")
        store.scripts.data[key] = "elsewhere:4242:abcd"  # its lease ran out; another took the id
        stop = asyncio.Event()
        await asyncio.wait_for(worker.keep_lease(stop), 5)
        await worker.stop()
        return stop.is_set(), worker.lease_lost, out.records, store.scripts.data[key]

    stopped, lost, records, holder = asyncio.run(run())
    assert stopped and lost is not None
    assert str(lost).startswith("worker id w1 was taken by another worker (elsewhere:4242)")
    assert not [r for r in records if isinstance(r, WorkerDown)]  # the id's live holder is not marked down
    assert holder == "elsewhere:4242:abcd"  # and keeps its lease


def test_a_clean_stop_says_workerdown_then_frees_the_id_for_the_next_start() -> None:
    async def run() -> tuple[list[Record], bool, str]:
        store = MemoryGenerationStore("ns")
        first = _worker(store)
        out = Recorder()
        first.outbox = Outbox(out, "worker w1")
        await first.lease.take()
        await first.stop()
        freed = store.keys.lease("worker:w1") not in store.scripts.data
        second = _worker(store)
        answer = await second.lease.take()
        return out.records, freed, answer.state

    records, freed, state = asyncio.run(run())
    assert [type(r) for r in records] == [WorkerDown] and freed and state == "acquired"
