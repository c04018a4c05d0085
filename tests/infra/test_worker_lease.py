"""One live process per worker id, on the real broker and Redis: `chunkserve worker` started
with a live worker's id is refused in one line and leaves its sessions where they are; the
id is free again once the live one is SIGKILLed (its lease runs out) and at once after a clean
stop; a worker whose id another process took stops."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
import redis

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.errors import LeaseHeldError
from schemas.records import WorkerDown, WorkerUp
from streams.config import Settings
from streams.config_file import child_env
from streams.generations import GenerationStore
from streams.kafka import RecordProducer
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration

WID = "w-lease"


def _settings(kafka_bootstrap: str, redis_url: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)


def _ups(records: list) -> int:
    return sum(isinstance(r, WorkerUp) and r.worker_id == WID for r in records)


def test_a_second_worker_with_a_live_id_is_refused_and_a_killed_or_stopped_ones_id_is_free(
        kafka_bootstrap, redis_url, namespace, tmp_path):
    settings = _settings(kafka_bootstrap, redis_url, namespace)
    client = redis.Redis.from_url(redis_url)
    fleet = LocalFleet(settings, tmp_path / "logs")
    found: dict = {}

    async def run() -> None:
        await ensure_topics(settings)
        store = GenerationStore.from_url(redis_url, namespace)
        try:
            await steps(store)
        finally:
            await store.aclose()

    async def steps(store: GenerationStore) -> None:
        key = store.keys.lease(f"worker:{WID}")
        fleet.start_worker(WID, capacity=2, chunk_interval_s=0.5)
        async with RecordProducer(settings) as producer, EventLog(settings, producer) as log:
            await log.until(lambda rs: _ups(rs) >= 1, 120, "the first worker", fleet.failed)
            first = fleet.procs[WID].pid
            gens = [await store.commit(sid, 0, WID) for sid in ("s1", "s2")]  # the live worker's sessions
            second = await asyncio.to_thread(
                subprocess.run, [sys.executable, "-m", "infra", "worker", "--worker-id", WID, "--capacity", "2"],
                env=child_env(settings), capture_output=True, text=True, timeout=180)
            found["second"] = (second, first)
            found["after_refusal"] = (await store.recovery_due(time.time() + 3600),
                                      [await store.session(s) for s in ("s1", "s2")], gens,
                                      (await store.load_view())[WID])
            killed = time.monotonic()
            fleet.kill(WID)  # SIGKILL: no clean stop, the lease is left to run out
            fleet.start_worker(WID, capacity=2, chunk_interval_s=0.5)
            await log.until(lambda rs: _ups(rs) >= 2, 120, "the restart after SIGKILL", fleet.failed)
            found["restart"] = (time.monotonic() - killed, (await store.recovery_due(time.time() + 3600))[0],
                                client.get(key), fleet.procs[WID].pid)
            assert fleet.stop(WID) == 0  # SIGTERM: a clean stop
            found["freed"] = client.exists(key)
            await log.until(lambda rs: any(isinstance(r, WorkerDown) and r.worker_id == WID for r in rs), 30,
                            "the WorkerDown of the clean stop")
            fleet.start_worker(WID, capacity=2, chunk_interval_s=0.5)
            await log.until(lambda rs: _ups(rs) >= 3, 120, "the start after a clean stop", fleet.failed)

    try:
        asyncio.run(run())
    finally:
        fleet.stop_all()
        client.close()
    second, first = found["second"]
    said = [line for line in (second.stdout + second.stderr).splitlines() if "held by another live worker" in line]
    assert second.returncode == 2, second.stdout + second.stderr
    assert len(said) == 1 and "Traceback" not in second.stdout + second.stderr
    assert second.stderr.strip().splitlines()[-1:] == [said[0]] and not second.stdout.strip()  # that one line, on stderr
    assert f"worker id {WID} is held by another live worker (" in said[0] and f":{first})" in said[0]
    assert "give each worker its own id" in said[0]
    (queued, due), views, gens, load = found["after_refusal"]
    assert (queued, due) == (0, [])  # the live worker's sessions were not queued for recovery
    assert [v.generation for v in views] == gens and not any(v.stranded for v in views)
    assert not load.down
    waited_s, queued_after_restart, holder, restarted = found["restart"]
    assert queued_after_restart == 2  # the restart queued what the killed run held, as before
    assert holder is not None and f":{restarted}:" in holder.decode()
    assert waited_s < 90, waited_s  # generous: the lease (5 s), the margin and a process start
    assert found["freed"] == 0  # a clean stop frees the id: the next start does not wait
    print(f"restart after SIGKILL: WorkerUp {waited_s:.1f} s after the kill")


def test_a_worker_whose_id_another_process_took_stops_and_leaves_it_alone(kafka_bootstrap, redis_url, namespace):
    from workers.null_model import NullModel
    from workers.runtime import Worker, WorkerConfig

    settings = _settings(kafka_bootstrap, redis_url, namespace)
    client = redis.Redis.from_url(redis_url)

    async def run() -> tuple[BaseException | None, bytes | None, list]:
        await ensure_topics(settings)
        store = GenerationStore.from_url(redis_url, namespace)
        worker = Worker(settings, WorkerConfig(worker_id=WID, capacity=2, heartbeat_s=0.1, lease_s=0.5),
                        NullModel(), store)
        key = store.keys.lease(f"worker:{WID}")
        try:
            async with RecordProducer(settings) as producer, EventLog(settings, producer) as log:
                serving = asyncio.create_task(worker.run(asyncio.Event()))
                await log.until(lambda rs: _ups(rs) >= 1, 60, "the worker")
                assert client.get(key) == worker.lease.token.encode()
                client.set(key, "elsewhere:4242:abcd", px=60_000)  # as if its lease had run out and been taken
                try:
                    await asyncio.wait_for(serving, 30)
                    error = None
                except LeaseHeldError as exc:
                    error = exc
                for _ in range(20):  # two seconds more of its events
                    await log.pump()
                return error, client.get(key), log.records
        finally:
            await store.aclose()

    try:
        error, holder, records = asyncio.run(run())
    finally:
        client.close()
    assert error is not None and str(error).startswith(f"worker id {WID} was taken by another worker (elsewhere:4242)")
    assert holder == b"elsewhere:4242:abcd"  # its stop left the new holder's lease alone
    assert not [r for r in records if isinstance(r, WorkerDown) and r.worker_id == WID]
