"""The provisioner rides through a group that moved on without it: its commit is refused
(CommitFailedError, which ended it and, with it, its workers), it rejoins and carries on, and
the command delivered again is not carried out twice; so through a 25 s broker pause, the
operator's report. A broker error made of several lines is told in one.

An Apache Kafka of the tests' own (the shared one must not be paused); the provisioner's
children are real processes (a stand-in command: no model to load). The broker pause does not
always make the group forget the member (a broker resumed may reload the group with its
members), so the refused commit is made certain by a provisioner whose start holds the whole
process past the group's 10 s session timeout (a blocking platform call)."""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from schemas import records as r
from streams.config import Settings
from streams.kafka import broker_error_line

POOL = "p"
SLEEPER = (sys.executable, "-c", "import time; time.sleep(600)")  # a worker that only lives


@pytest.fixture(scope="module")
def own_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from infra.apache_kafka import EmbeddedKafka, java_available

    if not java_available():
        pytest.skip("no Java: the broker pause needs the embedded Apache Kafka")
    kafka = EmbeddedKafka(tmp_path_factory.mktemp("kafka"), brokers=1).start()
    try:
        yield kafka
    finally:
        kafka.stop()


def _settings(kafka: Any, redis_url: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka.bootstrap, redis_url)


async def _until(done: Any, timeout_s: float, what: str, task: asyncio.Task[None]) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert not task.done(), f"the provisioner ended while waiting for {what}: {task.exception()!r}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _ride_through(settings: Settings, prov: Any, fault: Any, refused: Any) -> None:
    """d1 starts p-0; ``fault`` runs; d2 then starts p-1 and d1 (if delivered again) nothing."""
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics
    from workers.provisioner import run_provisioner

    await ensure_topics(settings)
    stop = asyncio.Event()
    task = asyncio.ensure_future(run_provisioner(settings, stop, prov, retry_s=0.3))
    try:
        async with RecordProducer(settings) as producer:
            await producer.send(r.ScaleOut(pool=POOL, count=1, ts=time.time(), decision_id="d1"))
            await _until(lambda: "p-0" in prov.procs, 120, "the first worker", task)
            await fault(task)
            await _until(refused, 90, "the commit refused", task)
            await producer.send(r.ScaleOut(pool=POOL, count=1, ts=time.time(), decision_id="d2"))
            await _until(lambda: "p-1" in prov.procs, 90, "a worker started after the rejoin", task)
            await asyncio.sleep(1.0)
            assert sorted(prov.procs) == ["p-0", "p-1"]  # d1, if delivered again, started nothing
            assert all(p.poll() is None for p in prov.procs.values())  # its workers live on
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)


def _refusals(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [x.getMessage() for x in caplog.records if x.name == "streams.kafka" and "commit refused" in x.getMessage()]


@pytest.mark.integration
def test_the_provisioner_and_its_workers_outlive_a_broker_pause(
        own_kafka: Any, redis_url: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from workers.provisioner import LocalProcessProvisioner

    caplog.set_level(logging.WARNING, logger="streams.kafka")
    settings = _settings(own_kafka, redis_url, namespace)

    async def pause(task: asyncio.Task[None]) -> None:
        await asyncio.sleep(2.0)  # d1's offset committed
        own_kafka.pause(own_kafka.nodes[0].node_id)  # the operator's `kill -STOP` of the broker
        await asyncio.sleep(25.0)
        own_kafka.resume(own_kafka.nodes[0].node_id)
        await asyncio.sleep(15.0)  # past the session timeout: a member forgotten has found out
        assert not task.done(), repr(task.exception())

    prov = LocalProcessProvisioner(settings, POOL, command=SLEEPER, log_dir=tmp_path / "logs")
    asyncio.run(_ride_through(settings, prov, pause, lambda: True))
    assert len(_refusals(caplog)) <= 1


class _BlockingStart:
    """The local provisioner, but its second start holds the process (heartbeats included)
    past the group's session timeout, as a blocking platform call would."""

    def __init__(self, inner: Any, hold_s: float) -> None:
        self.inner, self.hold_s, self.starts = inner, hold_s, 0
        self.pool, self.procs = inner.pool, inner.procs

    async def start(self, count: int, gpu_type: str) -> list[str]:
        self.starts += 1
        if self.starts == 1:
            await asyncio.sleep(0.5)  # the ScaleOut's offset stays uncommitted a moment
            time.sleep(self.hold_s)  # noqa: ASYNC101 - the point: nothing else runs meanwhile
        return await self.inner.start(count, gpu_type)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@pytest.mark.integration
def test_a_refused_commit_is_ridden_through_and_the_command_not_carried_out_twice(
        own_kafka: Any, redis_url: str, namespace: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from workers.provisioner import LocalProcessProvisioner

    caplog.set_level(logging.WARNING, logger="streams.kafka")
    settings = _settings(own_kafka, redis_url, namespace)
    prov = _BlockingStart(LocalProcessProvisioner(settings, POOL, command=SLEEPER, log_dir=tmp_path / "logs"), 13.0)

    async def nothing(task: asyncio.Task[None]) -> None:
        pass

    asyncio.run(_ride_through(settings, prov, nothing, lambda: bool(_refusals(caplog))))
    said = _refusals(caplog)
    assert len(said) == 1 and "\n" not in said[0] and "\\n" not in said[0], said
    assert "CommitFailedError: Commit cannot be completed" in said[0]


def test_a_broker_error_of_several_lines_is_told_in_one() -> None:
    from aiokafka.errors import CommitFailedError, KafkaConnectionError, RequestTimedOutError

    line = broker_error_line(CommitFailedError("Commit cannot be completed since the group has already "
                                               "rebalanced"))
    assert "\n" not in line and "\\n" not in line and "'" not in line
    assert line.startswith("CommitFailedError: Commit cannot be completed since the group has already rebalanced "
                           "and assigned the partitions to another member. This means")
    assert line.endswith("max_poll_records.; Commit cannot be completed since the group has already rebalanced")
    assert broker_error_line(KafkaConnectionError("lost\n  the connection")) == "KafkaConnectionError: lost the connection"
    assert broker_error_line(RequestTimedOutError()) == "[Error 7] RequestTimedOutError"


def test_commands_delivered_again_after_a_refused_commit_are_not_carried_out_twice() -> None:
    """Unit (the store's in-memory twin, a recording platform): a Shutdown delivered again once
    its worker is stopped and deregistered is done, not refused as someone else's nor a crash
    (set_draining on a worker the store forgot raised NoCapacityError); a ScaleOut again is
    refused as replayed; a Drain of a worker not registered yet is no crash."""
    from streams.generations_memory import MemoryGenerationStore
    from workers.provisioner import ProvisionerService

    class Platform:
        pool = POOL

        def __init__(self) -> None:
            self.started: list[str] = []
            self.running: set[str] = set()

        async def start(self, count: int, gpu_type: str) -> list[str]:
            ids = [f"p-{len(self.started) + i}" for i in range(count)]
            self.started += ids
            self.running |= set(ids)
            return ids

        async def drain(self, worker_id: str) -> None:
            pass

        async def reinstate(self, worker_id: str) -> None:
            pass

        async def shutdown(self, worker_id: str) -> bool:
            if worker_id not in self.running:
                return False
            self.running.discard(worker_id)
            return True

    async def run() -> tuple[Platform, list[r.Record]]:
        store, sent, platform = MemoryGenerationStore("ns"), [], Platform()

        async def publish(rec: r.Record) -> None:
            sent.append(rec)

        service = ProvisionerService(platform, store, publish, clock=lambda: 1.0)
        scale = r.ScaleOut(pool=POOL, count=1, ts=1.0, decision_id="d1")
        await service.handle(scale)
        await service.handle(r.ScaleOut(pool=POOL, count=1, ts=1.0, decision_id="d1", gpu_type="other"))  # its own type
        await service.handle(r.Drain(pool=POOL, worker_id="p-0", ts=1.0))  # booting: not registered yet
        await store.register_worker("p-0", 2)
        shutdown = r.Shutdown(pool=POOL, worker_id="p-0", ts=1.0)
        await service.handle(shutdown)
        for again in (scale, shutdown, r.Drain(pool=POOL, worker_id="p-0", ts=1.0)):  # the redelivery
            await service.handle(again)
        await service.retry()
        return platform, sent

    platform, sent = asyncio.run(run())
    assert platform.started == ["p-0", "p-1"] and platform.running == {"p-1"}
    assert [(type(x).__name__, getattr(x, "reason", "")) for x in sent] == [
        ("WorkerDown", "shutdown by provisioner"), ("CommandRejected", "replayed")]


def test_a_reinstate_reopens_a_drained_workers_admission_but_not_one_asked_to_stop() -> None:
    """Unit (the store's in-memory twin, a recording platform): a Drain closes admission in the
    store and a Reinstate reopens it (delivered again, it is done again); a Reinstate after
    the worker's Shutdown is refused as ``stopping`` and the worker is stopped once empty."""
    from streams.generations_memory import MemoryGenerationStore
    from workers.provisioner import ProvisionerService

    class Platform:
        pool = POOL

        def __init__(self) -> None:
            self.said: list[str] = []

        async def start(self, count: int, gpu_type: str) -> list[str]:
            return []

        async def drain(self, worker_id: str) -> None:
            self.said.append(f"drain {worker_id}")

        async def reinstate(self, worker_id: str) -> None:
            self.said.append(f"reinstate {worker_id}")

        async def shutdown(self, worker_id: str) -> bool:
            self.said.append(f"shutdown {worker_id}")
            return True

    async def run() -> tuple[list[bool], Platform, list[r.Record]]:
        store, sent, platform = MemoryGenerationStore("ns"), [], Platform()

        async def publish(rec: r.Record) -> None:
            sent.append(rec)

        service = ProvisionerService(platform, store, publish, clock=lambda: 1.0)
        await store.register_worker("p-0", 2)
        await store.register_worker("p-1", 2)
        flags = []
        await service.handle(r.Drain(pool=POOL, worker_id="p-0", ts=1.0))
        flags.append((await store.load_view())["p-0"].draining)
        back = r.Reinstate(pool=POOL, worker_id="p-0", ts=2.0)
        await service.handle(back)
        await service.handle(back)  # delivered again
        flags.append((await store.load_view())["p-0"].draining)
        await service.handle(r.Shutdown(pool=POOL, worker_id="p-1", ts=3.0))  # empty: stopped at once
        await service.handle(r.Reinstate(pool=POOL, worker_id="p-1", ts=4.0))
        await service.handle(r.Reinstate(pool="other", worker_id="p-1", ts=4.0))  # another pool's
        return flags, platform, sent

    flags, platform, sent = asyncio.run(run())
    assert flags == [True, False]
    assert platform.said == ["drain p-0", "reinstate p-0", "reinstate p-0", "drain p-1", "shutdown p-1"]
    assert [(type(x).__name__, getattr(x, "reason", "")) for x in sent] == [
        ("WorkerDown", "shutdown by provisioner"), ("CommandRejected", "stopping")]
