"""Every bound's error path on the real broker and Redis: snapshot size, sessions per worker,
record size per topic."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace

import msgpack
import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.errors import ConfigError, LimitError, SchemaError
from schemas.codec import encode
from schemas.records import (Assign, ChunkDone, CommandRejected, DeadLetter, Generation, Handoff,
                             InputAccepted, InputPushed, RoutedInput, SessionOpened, Suspend, WorkerUp)
from schemas.topics import DEAD_LETTERS, SESSION_EVENTS, SESSION_INPUTS, WORKER_COMMANDS, WORKER_EVENTS
from streams.config import Settings
from streams.generations import SyncGenerationStore
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration


def _settings(kafka_bootstrap: str, redis_url: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)


def test_store_refuses_snapshots_over_the_bound_and_writes_nothing(redis_url, namespace):
    big = SyncGenerationStore.from_url(redis_url, namespace, max_snapshot_bytes=1 << 20)
    small = SyncGenerationStore.from_url(redis_url, namespace, max_snapshot_bytes=4096)
    try:
        small.register_worker("w", 2)
        gen = small.commit("s1", 0, "w")
        with pytest.raises(LimitError) as info:
            small.put_snapshot("s1", gen, b"x" * 5000)
        assert info.value.setting == "max_snapshot_bytes" and info.value.size == 5000
        assert small.read_snapshot("s1") is None  # nothing was written
        big.put_snapshot("s1", gen, b"y" * 5000)  # stored under a larger bound ...
        with pytest.raises(LimitError, match="stored snapshot"):
            small.read_snapshot("s1")  # ... is not pulled into memory under a smaller one
        assert big.read_snapshot("s1")[1] == b"y" * 5000
    finally:
        big.close()
        small.close()


def test_worker_keeps_a_session_whose_snapshot_is_over_the_bound(kafka_bootstrap, redis_url, namespace,
                                                                  tmp_path):
    """Suspend and Handoff need a snapshot; over ``max_snapshot_bytes`` the worker refuses
    them with the reason and keeps serving the session, which stays current and claimed."""
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    store = SyncGenerationStore.from_url(redis_url, namespace)
    fleet = LocalFleet(settings, tmp_path / "logs", extra_env={"CHUNKSERVE_MAX_SNAPSHOT_BYTES": "2048"})

    async def run() -> list:
        await ensure_topics(settings)
        fleet.start_worker("w-big", capacity=2, chunk_interval_s=0.2)
        async with RecordProducer(settings) as producer:
            log = EventLog(settings, producer)
            await log.start()
            await log.until(lambda rs: any(isinstance(r, WorkerUp) for r in rs), 90, "the worker")
            store.register_worker("w-other", 2)
            gen = store.commit("s-big", 0, "w-big")
            await producer.send(Assign(worker_id="w-big", session_id="s-big", generation=gen, ts=time.time()))
            await log.until(lambda rs: sum(isinstance(r, ChunkDone) for r in rs) >= 2, 60, "first chunks")
            await producer.send(Suspend(worker_id="w-big", session_id="s-big", generation=gen, ts=time.time()))
            await producer.send(Handoff(worker_id="w-big", session_id="s-big", generation=gen,
                                        target_worker="w-other", ts=time.time()))
            await log.until(lambda rs: sum(isinstance(r, CommandRejected) for r in rs) >= 2, 60, "refusals")
            seen = sum(isinstance(r, ChunkDone) for r in log.records)
            await log.until(lambda rs: sum(isinstance(r, ChunkDone) for r in rs) >= seen + 3, 60,
                            "chunks after the refusals")
            await log.stop()
            return log.records

    try:
        records = asyncio.run(run())
        view = store.session("s-big")
    finally:
        fleet.stop_all()
        store.close()
    refused = [r for r in records if isinstance(r, CommandRejected)]
    assert sorted(r.command for r in refused) == sorted([Suspend.TAG, Handoff.TAG])
    assert all(r.reason == "over_limit" and "max_snapshot_bytes" in r.detail for r in refused)
    assert view is not None and view.generation == Generation("w-big", 1)
    assert view.state == "active" and view.claimed and view.snapshot is None
    chunks = [r.chunk_index for r in records if isinstance(r, ChunkDone) and r.session_id == "s-big"]
    assert chunks == list(range(len(chunks)))  # served throughout, no gap


def test_worker_refuses_a_capacity_over_the_bound(kafka_bootstrap, redis_url, namespace):
    env = dict(os.environ, CHUNKSERVE_KAFKA_BOOTSTRAP=kafka_bootstrap, CHUNKSERVE_REDIS_URL=redis_url,
               CHUNKSERVE_NAMESPACE=namespace, CHUNKSERVE_MAX_SESSIONS_PER_WORKER="4")
    done = subprocess.run([sys.executable, "-m", "infra", "worker", "--worker-id", "w-huge", "--capacity", "5"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "max_sessions_per_worker" in done.stderr and "Traceback" not in done.stdout + done.stderr
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    with pytest.raises(ConfigError, match="max_sessions_per_worker"):
        from workers.runtime import Worker, WorkerConfig
        Worker(replace(settings, max_sessions_per_worker=4), WorkerConfig(worker_id="w", capacity=5),
               model=None, store=None)  # type: ignore[arg-type]


def test_records_over_their_topic_bound_are_refused_and_dead_lettered(kafka_bootstrap, redis_url,
                                                                       namespace):
    """The producer refuses to send one; a consumer dead-letters one another client sent."""
    settings = replace(_settings(kafka_bootstrap, redis_url, namespace),
                       record_bytes={"session-events": 2048})
    small = SessionOpened(session_id="ok", ts=time.time(), prompt="p" * 1000)
    big = SessionOpened(session_id="big", ts=time.time(), prompt="p" * 3000)

    async def run() -> tuple[list, int]:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            with pytest.raises(SchemaError, match="2048-byte limit"):
                await producer.send(big)
            await producer.send_raw(SESSION_EVENTS, encode(big), key=b"big")  # a client ignoring the bound
            await producer.send(small)
            consumer = RecordConsumer(settings, [SESSION_EVENTS], producer, name="bounded",
                                      group_id=f"{namespace}-bounded")
            await consumer.start()
            got: list = []
            deadline = time.monotonic() + 30
            while not got and time.monotonic() < deadline:
                got = await consumer.poll(timeout_ms=200)
            dead = consumer.dead_lettered
            await consumer.stop()
            return [d.record for d in got], dead

    got, dead = asyncio.run(run())
    assert got == [small] and dead == 1


def test_dispatch_refuses_inputs_over_the_payload_and_rate_bounds(kafka_bootstrap, redis_url, namespace,
                                                                   tmp_path):
    """Through the running dispatch processor: an input over ``max_input_bytes`` and inputs
    beyond the session's rate are refused to ``dead-letters`` with the reason, never dropped;
    the session's next input reaches its owner naming the refused ones, and is applied."""
    settings = replace(_settings(kafka_bootstrap, redis_url, namespace), max_input_bytes=100,
                       input_rate_per_s=1e-4, input_burst=2)  # one window for the test
    fleet = LocalFleet(settings, tmp_path / "logs")

    def refusals(rs: list) -> list[str]:
        return [x.reason for x in rs if isinstance(x, DeadLetter) and x.reason.startswith("refused")]

    def routed(rs: list) -> list:
        return [x for x in rs if isinstance(x, RoutedInput) and x.session_id == "s-owned"]

    from infra.embedded import free_port

    port = free_port()

    async def run() -> tuple[list[str], list]:
        await ensure_topics(settings)
        fleet.start_processor("dispatch", options=["--metrics-port", str(port)])
        fleet.start_worker("w", capacity=2)
        async with RecordProducer(settings) as producer, \
                EventLog(settings, producer, topics=(DEAD_LETTERS, WORKER_COMMANDS, WORKER_EVENTS)) as log:
            await log.until(lambda rs: any(isinstance(x, WorkerUp) for x in rs), 90, "the worker up")
            await producer.send(SessionOpened(session_id="s-owned", ts=time.time()))
            await producer.send(InputPushed(session_id="s-owned", seq=1, kind="text", payload="x" * 101, ts=1.0))
            await producer.send(InputPushed(session_id="s-owned", seq=2, kind="text", payload="ok", ts=1.0))
            await producer.send(InputPushed(session_id="s-big", seq=1, kind="text", payload="x" * 101, ts=1.0))
            for seq in range(1, 5):  # a burst of two is allowed, the next two are over the rate
                await producer.send(InputPushed(session_id="s-fast", seq=seq, kind="text", payload="hi", ts=1.0))
            misfiled = InputPushed(session_id="s-key", seq=1, kind="text", payload="hi", ts=1.0)
            await producer.send_raw(SESSION_INPUTS, encode(misfiled), key=b"someone-else")  # not its session's key
            await log.until(lambda rs: len(refusals(rs)) >= 5, 90, "the refusals")
            scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
            assert 'chunkserve_records_dead_lettered_total{topic="session-inputs"} 5.0' in scraped  # each counted
            await log.until(lambda rs: any(isinstance(x, InputAccepted) and x.session_id == "s-owned"
                                           for x in rs), 90, "the owned session's input applied")
            return refusals(log.records), log.records

    try:
        refused, records = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert [(x.seq, x.refused_before) for x in routed(records)] == [(2, (1,))]
    assert [x.seq for x in records if isinstance(x, InputAccepted) and x.session_id == "s-owned"] == [2]
    assert sum("over the 100-byte limit" in x for x in refused) == 2
    assert sum("input rate over" in x for x in refused) == 2
    assert sum("key 'someone-else': not the session id 's-key'" in x for x in refused) == 1
    up = next(x for x in records if isinstance(x, WorkerUp))  # the worker says the rule its replays apply
    assert (up.input_rate_per_s, up.input_burst) == (1e-4, 2) and up.chunk_interval_s > 0
    assert "replays inputs with the rate rule" not in "".join(p.read_text() for p in (tmp_path / "logs").glob("dispatch*.log"))


def test_the_input_log_leaves_out_what_dispatch_refuses_whenever_it_reads_it(kafka_bootstrap, redis_url,
                                                                             namespace):
    """A recovery's replay and a close's refusals read the session's inputs back from the log:
    an input over ``max_input_bytes``, keyed by another id or not decoding was dead-lettered when
    dispatch read it, so it is neither applied on replay nor refused a second time, nor waited
    for."""
    from streams.input_log import read_session_inputs

    settings = replace(_settings(kafka_bootstrap, redis_url, namespace), max_input_bytes=100,
                       partitions={SESSION_INPUTS: 1})  # the misfiled record shares the session's partition

    async def run() -> list[tuple[int, tuple[int, ...]]]:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            await producer.send(InputPushed(session_id="s", seq=1, kind="text", payload="ok", ts=1.0))
            await producer.send(InputPushed(session_id="s", seq=2, kind="text", payload="x" * 101, ts=1.0))
            misfiled = InputPushed(session_id="s", seq=3, kind="text", payload="ok", ts=1.0)
            await producer.send_raw(SESSION_INPUTS, encode(misfiled), key=b"someone-else")
            await producer.send(InputPushed(session_id="s", seq=4, kind="text", payload="ok", ts=1.0))
            # a field of the wrong type: dead-lettered for its schema, its bytes still name seq 5
            wire = msgpack.unpackb(encode(InputPushed(session_id="s", seq=5, kind="text", payload="ok", ts=1.0)))
            await producer.send_raw(SESSION_INPUTS, msgpack.packb({**wire, "kind": 7}), key=b"s")
            await producer.send(InputPushed(session_id="s", seq=6, kind="text", payload="ok", ts=1.0))
            # the same keyed by another id: dispatch cannot tell it is the session's, nor can a replay
            await producer.send_raw(SESSION_INPUTS, msgpack.packb({**wire, "seq": 7, "kind": 7}), key=b"someone-else")
            await producer.send(InputPushed(session_id="s", seq=8, kind="text", payload="ok", ts=1.0))
        return [(x.record.seq, x.refused_before) for x in await read_session_inputs(settings, "s", 0)]

    # input 4 names 2 and 3 as refused before it, input 6 names 5: a replay's owner does not wait for them
    assert asyncio.run(run()) == [(1, ()), (4, (2, 3)), (6, (5,)), (8, ())]


def test_the_rate_rule_is_decided_from_the_log_by_a_replay_and_by_a_dispatch_that_restarts(
        kafka_bootstrap, redis_url, namespace):
    """An input dispatch refused for the rate stays in the log: a recovery's replay from a
    snapshot taken after input 1 counts input 1 (read back by its broker timestamp), so of
    inputs 2-5 it applies only 2, as dispatch routed; and a dispatch reading the partition from
    input 3 on, as after a restart, refuses 3 as the first one did."""
    from processors.agents.dispatch import DispatchShell
    from streams.input_log import count_partition_inputs, read_session_inputs

    # a burst of two per window of 2,000,000 s: the five inputs share a window
    settings = replace(_settings(kafka_bootstrap, redis_url, namespace), input_rate_per_s=1e-6, input_burst=2,
                       partitions={SESSION_INPUTS: 1})

    async def run() -> tuple[list[int], list[int], list[int], str | None, str | None]:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            for seq in range(1, 6):
                await producer.send(InputPushed(session_id="s", seq=seq, kind="text", payload="ok", ts=1.0))
        every = await read_session_inputs(settings, "s", 0)
        consumer = RecordConsumer(settings, [SESSION_INPUTS], None, name="test-read")
        await consumer.start(subscribe=False)
        try:
            ends = await consumer.assign({SESSION_INPUTS: [0]})
            logged = [d async for d in consumer.read_to(ends)]
        finally:
            await consumer.stop()
        first = next(d for d in logged if d.record.seq == 1)  # type: ignore[attr-defined]
        replayed = await read_session_inputs(settings, "s", 1, start=(0, first.offset))
        third = next(d for d in logged if d.record.seq == 3)  # type: ignore[attr-defined]
        stamp = third.timestamp_ms / 1000.0  # type: ignore[operator]
        window_start = (stamp * 1e-6 // 2) * 2 / 1e-6
        before_third = (await count_partition_inputs(settings, 0, third.offset, window_start)).get("s")

        async def count_in_window(partition: int, offset: int, start_s: float) -> dict[str, list[int]]:
            return await count_partition_inputs(settings, partition, offset, start_s)

        restarted = DispatchShell(store=None, publisher=None, input_rate=1e-6, input_burst=2,
                                  count_in_window=count_in_window)
        verdicts = []
        for d in logged[2:4]:  # inputs 3 and 4, read from a committed offset after input 2
            await restarted.rate_windows.read(d.record, d.key, 0, d.offset, d.timestamp_ms / 1000.0)  # type: ignore[arg-type, operator]
            verdicts.append(restarted.admit_input(d.record, d.key, d.timestamp_ms / 1000.0))  # type: ignore[arg-type, operator]
        return [x.record.seq for x in every], [x.record.seq for x in replayed], before_third, *verdicts

    every, replayed, before_third, third, fourth = asyncio.run(run())
    assert every == [1, 2]  # 3-5 past the burst
    assert replayed == [2]  # input 1 counted from before the snapshot: 3 is not applied
    assert before_third == [1, 2]
    assert third is not None and "input rate" in third and fourth is not None and "input rate" in fourth
