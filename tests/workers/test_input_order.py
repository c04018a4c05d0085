"""A worker applies a session's inputs in seq order, waits a bounded time for a missing one,
then applies the rest; a missing input arriving after that, and inputs still waiting when the
session closes, are refused with the reason. Every input ends accepted or refused.

Real model (torch, on the CPU) and the store's in-memory twin; the producer records what
the worker publishes."""

from __future__ import annotations

import asyncio
from typing import Any

import torch

from schemas.records import (Assign, CommandRejected, Generation, InputAccepted, Record, RoutedInput,
                             Suspend, Terminate)
from streams.config import Settings
from streams.generations_memory import MemoryGenerationStore
from workers.model import ModelConfig, ReferenceModel
from workers.outbox import Outbox
from workers.runtime import Worker, WorkerConfig


class Recorder:
    def __init__(self) -> None:
        self.records: list[Record] = []

    async def send(self, rec: Record, wait: bool = False) -> Any:
        self.records.append(rec)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done

    def accepted(self) -> list[int]:
        return [r.seq for r in self.records if isinstance(r, InputAccepted)]

    def refused(self) -> dict[int, str]:
        return {r.seq: r.reason for r in self.records if isinstance(r, CommandRejected)}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _input(gen: Generation, seq: int, refused_before: tuple[int, ...] = ()) -> RoutedInput:
    return RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq, kind="text",
                       payload=f"steer {seq}", ts=1.0, refused_before=refused_before)


async def _worker() -> tuple[Worker, Recorder, Clock, Generation, MemoryGenerationStore]:
    torch.set_num_threads(1)
    store, out, mono = MemoryGenerationStore("w"), Recorder(), Clock()
    await store.register_worker("w", 2)
    gen = await store.commit("s", 0, "w")
    worker = Worker(Settings(), WorkerConfig(worker_id="w", capacity=2, input_gap_wait_s=5.0),
                    ReferenceModel(ModelConfig(), seed=1), store, clock=lambda: 1.0, monotonic=mono)
    worker.outbox = Outbox(out, "worker w")
    await worker.handle(Assign(worker_id="w", session_id="s", generation=gen, ts=1.0, prompt="p"))
    return worker, out, mono, gen, store


def test_a_gap_is_waited_for_then_skipped_and_the_late_input_refused() -> None:
    async def run() -> None:
        worker, out, mono, gen, store = await _worker()
        for seq in (1, 3, 4):
            await worker.handle(_input(gen, seq))
        assert out.accepted() == [1]
        mono.now += 4.9
        assert await worker.expire_gaps() == 0 and out.accepted() == [1]
        mono.now += 0.2
        assert await worker.expire_gaps() == 1
        assert out.accepted() == [1, 3, 4]
        assert (await store.session("s")).input_seq == 4
        await worker.handle(_input(gen, 2))  # the missing one, late
        assert out.refused() == {2: "late"}
        await worker.handle(_input(gen, 4))  # a redelivery of an applied one: nothing new
        await worker.handle(_input(gen, 5))
        assert out.accepted() == [1, 3, 4, 5] and out.refused() == {2: "late"}

    asyncio.run(run())


def test_an_input_dispatch_refused_is_not_waited_for() -> None:
    """Dispatch refused seqs 2 and 3 (over a bound) and names them on seq 4: the owner applies
    4 at once, and 6 (naming 5) too; 8 names nothing and waits out the gap for 7."""
    async def run() -> None:
        worker, out, mono, gen, store = await _worker()
        await worker.handle(_input(gen, 1))
        await worker.handle(_input(gen, 4, refused_before=(2, 3)))
        assert out.accepted() == [1, 4]
        await worker.handle(_input(gen, 6, refused_before=(1, 5)))  # 1: applied already, ignored
        await worker.handle(_input(gen, 8))
        assert out.accepted() == [1, 4, 6]
        mono.now += 5.1
        assert await worker.expire_gaps() == 1 and out.accepted() == [1, 4, 6, 8]
        # a valid copy of 3, sent again after dispatch refused it: refused as late, not
        # taken for a duplicate of an applied input and dropped without a word
        await worker.handle(_input(gen, 3))
        assert out.refused() == {3: "late"} and out.accepted() == [1, 4, 6, 8]
        assert set((await store.session("s")).skipped) >= {2, 3, 5, 7}  # the store knows, for the next owner

    asyncio.run(run())


def test_an_input_dispatch_refused_is_still_applied_when_its_copy_comes_in_time() -> None:
    async def run() -> None:
        worker, out, _mono, gen, _store = await _worker()
        await worker.handle(_input(gen, 1))
        await worker.handle(_input(gen, 4, refused_before=(2,)))  # waits for 3
        await worker.handle(_input(gen, 2))  # the retry of 2, before anything passed it over
        await worker.handle(_input(gen, 3))
        assert out.accepted() == [1, 2, 3, 4] and out.refused() == {}

    asyncio.run(run())


def test_inputs_waiting_when_the_session_closes_are_refused() -> None:
    async def run() -> None:
        worker, out, _mono, gen, _store = await _worker()
        for seq in (1, 3, 4):
            await worker.handle(_input(gen, seq))
        await worker.handle(Terminate(worker_id="w", session_id="s", generation=gen, ts=2.0))
        assert out.accepted() == [1]
        assert out.refused() == {3: "closed", 4: "closed"}

    asyncio.run(run())


def test_waiting_inputs_are_applied_before_an_offload() -> None:
    """A snapshot keeps no waiting input: what waits for a missing one is applied past it, and
    the missing one is recorded as given up on (the store and the snapshot keep it)."""
    async def run() -> None:
        worker, out, _mono, gen, store = await _worker()
        for seq in (2, 3):
            await worker.handle(_input(gen, seq))
        await worker.handle(Suspend(worker_id="w", session_id="s", generation=gen, ts=2.0))
        assert out.accepted() == [2, 3]
        view = await store.session("s")
        assert view.state == "suspended" and view.snapshot is not None and view.snapshot.input_seq == 3
        assert view.skipped == (1,)

    asyncio.run(run())


def test_heartbeats_go_out_while_the_loop_waits_on_the_store() -> None:
    """A worker whose chunk loop is stuck on a store call (a Redis failover) still beats, so
    control does not declare it dead and move its sessions for nothing."""
    from schemas.records import Heartbeat

    async def run() -> int:
        worker, out, mono, gen, store = await _worker()
        worker.config = WorkerConfig(worker_id="w", capacity=2, heartbeat_s=0.05)
        stop = asyncio.Event()
        stuck = asyncio.Event()  # the store call that does not come back
        beats = asyncio.get_running_loop().create_task(worker.beat(stop))
        try:
            await asyncio.wait_for(stuck.wait(), 0.3)
        except asyncio.TimeoutError:
            pass
        stop.set()
        await beats
        return sum(isinstance(r, Heartbeat) for r in out.records)

    assert asyncio.run(run()) >= 4


def test_released_and_frozen_name_the_last_chunk_released_under_the_generation() -> None:
    from schemas.records import ChunkDone, Frozen, Handoff, Released

    async def run() -> None:
        worker, out, mono, gen, store = await _worker()
        for _ in range(3):
            assert await worker.tick() == 1
            mono.now += 1.0
        last = [r.chunk_index for r in out.records if isinstance(r, ChunkDone)][-1]
        await store.register_worker("v", 2)
        await worker.handle(Handoff(worker_id="w", session_id="s", generation=gen, target_worker="v", ts=2.0))
        await worker.handle(Terminate(worker_id="w", session_id="s", generation=gen, ts=2.0))
        (frozen,) = [r for r in out.records if isinstance(r, Frozen)]
        (released,) = [r for r in out.records if isinstance(r, Released)]
        assert last == 2 and frozen.chunk_index == last and (released.reason, released.chunk_index) == ("closed", last)

    asyncio.run(run())


def test_each_gap_is_waited_for_from_when_it_blocks() -> None:
    """2 is missing from t; it comes at t + 4 and 3 goes with it; 5 (4 missing) then waits
    a whole gap wait from t + 4, not what was left of 2's."""
    async def run() -> None:
        worker, out, mono, gen, _store = await _worker()
        for seq in (1, 3, 5):
            await worker.handle(_input(gen, seq))
        mono.now += 4.0
        await worker.handle(_input(gen, 2))
        assert out.accepted() == [1, 2, 3]
        mono.now += 2.0  # 6 s after 2's gap began, 2 s into 4's
        assert await worker.expire_gaps() == 0 and out.accepted() == [1, 2, 3]
        mono.now += 3.1
        assert await worker.expire_gaps() == 1 and out.accepted() == [1, 2, 3, 5]

    asyncio.run(run())


def test_a_workers_released_chunks_series_is_there_at_zero_from_its_start() -> None:
    """It appeared only with the first chunk: a scrape of an idle worker lacked it."""
    from prometheus_client import REGISTRY

    Worker(Settings(), WorkerConfig(worker_id="w-idle", capacity=2), ReferenceModel(ModelConfig(), seed=1),
           MemoryGenerationStore("w-idle"))
    assert REGISTRY.get_sample_value("chunkserve_chunks_released_total", {"worker": "w-idle"}) == 0.0


def test_a_producer_that_numbers_again_from_1_gets_its_inputs_refused_not_dropped() -> None:
    """A front end restarted with a new SessionClient numbered the session's inputs from 1
    again: its records came later in session-inputs than the inputs applied, and the owner
    dropped them without a verdict (taken for duplicate deliveries). They are refused, naming
    the way on; the applied records delivered again still produce nothing."""
    def logged(gen: Generation, seq: int, offset: int, text: str) -> RoutedInput:
        return RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq, kind="text", payload=text,
                           ts=1.0, source_partition=2, source_offset=offset)

    async def run() -> None:
        worker, out, _mono, gen, store = await _worker()
        for seq in (1, 2, 3):
            await worker.handle(logged(gen, seq, 40 + seq, f"first {seq}"))
        assert out.accepted() == [1, 2, 3]
        await worker.handle(logged(gen, 2, 42, "first 2"))  # the same record again: nothing
        assert out.refused() == {}
        for seq, offset in ((1, 50), (2, 51)):  # the restarted producer's
            await worker.handle(logged(gen, seq, offset, f"after restart {seq}"))
        refusals = [r for r in out.records if isinstance(r, CommandRejected)]
        assert [(r.seq, r.reason) for r in refusals] == [(1, "late"), (2, "late")]
        assert all("uses its seq again" in r.detail and "offset 5" in r.detail for r in refusals)
        await worker.handle(logged(gen, 4, 52, "goes on"))  # numbered on from the last accepted
        assert out.accepted() == [1, 2, 3, 4] and (await store.session("s")).input_seq == 4

    asyncio.run(run())
