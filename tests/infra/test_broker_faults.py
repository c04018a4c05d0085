"""Broker faults on the real Apache Kafka: a full restart of one broker, a leader failover on
three. Each test starts a cluster of its own (the shared one must not be killed)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Iterator

import pytest

from infra.apache_kafka import EmbeddedKafka, java_available
from infra.broker_faults import busiest_leader, plan, unserved_s
from infra.chaos import AUDIT_KEYS, ChaosConfig, run_chaos, unclean
from streams.config import Settings

pytestmark = pytest.mark.integration


def test_the_plan_and_the_figures():
    assert plan(1, 100.0) == [(60.0, "full_restart")]
    assert plan(3, 100.0, ("leader_kill",)) == [(25.0, "leader_kill")]
    assert busiest_leader({1: 4, 2: 9, 3: 9}) == 2
    # the gaps that began during the fault (or just before its kill) count
    assert unserved_s({"a": [0.0, 1.9, 6.0, 6.5], "b": [0.0, 0.5, 9.0]}, 2.0, 3.0) == 4.1
    assert unserved_s({"a": [0.0, 1.0, 6.0, 6.5]}, 2.0, 3.0) == 5.0
    assert unserved_s({"a": [0.0, 4.0, 9.0]}, 2.0, 3.0) == 0.0


def test_control_waits_while_the_broker_is_away_and_after():
    """Unit: no decision (nor death detection) during an outage and two heartbeat timeouts after."""
    from processors.agents.control import ControlShell
    from processors.agents.control_config import ControlConfig

    shell = ControlShell(ControlConfig(heartbeat_timeout_s=3.0))
    assert shell.due(100.0)
    shell.log_state(False, 100.0)
    assert not shell.due(109.0)
    shell.log_state(True, 110.0)
    assert not shell.due(115.9)
    assert shell.due(116.1)


def test_a_worker_sends_again_what_the_producer_gave_up_on():
    """Unit: events whose send failed (the broker away too long) go out again, in order."""
    from aiokafka.errors import KafkaConnectionError

    from schemas.records import Heartbeat
    from workers.outbox import Outbox

    class Producer:  # fails the first send of every record
        def __init__(self) -> None:
            self.sent: list[Any] = []

        async def send(self, rec: Any, wait: bool = False) -> Any:
            fut = asyncio.get_running_loop().create_future()
            if rec in self.sent:
                fut.set_result("ok")
            else:
                fut.set_exception(KafkaConnectionError("broker away"))
            self.sent.append(rec)
            return fut

    async def main() -> list[Any]:
        producer = Producer()
        outbox = Outbox(producer, "worker w")
        beats = [Heartbeat(worker_id="w", ts=float(i), sessions=0, executing=0, capacity=1) for i in range(3)]
        for beat in beats:
            await outbox.send(beat)
        await outbox.acknowledged(retry_s=0.0)
        assert not outbox._unacked
        return producer.sent

    sent = asyncio.run(main())
    assert [b.ts for b in sent] == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]


@pytest.fixture
def cluster(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[EmbeddedKafka]:
    if not java_available():
        pytest.skip("no Java: broker faults need the embedded Apache Kafka")
    kafka = EmbeddedKafka(tmp_path / "kafka", brokers=request.param).start()
    try:
        yield kafka
    finally:
        kafka.stop()


def _run(kafka: EmbeddedKafka, redis_url: str, namespace: str, logs: Path,
         kinds: tuple[str, ...], duration_s: float) -> dict[str, Any]:
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(
        kafka.bootstrap, redis_url)
    cfg = ChaosConfig(sessions=4, duration_s=duration_s, workers=3, capacity=6, heartbeat_timeout_s=6.0,
                      process_faults=False, broker_faults=kinds)
    return asyncio.run(run_chaos(settings, cfg, logs, broker=kafka))


def _assert_clean(result: dict[str, Any]) -> None:
    assert not [k for k in AUDIT_KEYS if result[k]], unclean(result)
    assert result["inputs_pushed"] > 0
    for event in result["broker_faults"]["events"]:
        assert event["restart_s"] is not None  # the cluster came back
        assert event["served_after"] == result["sessions"], event  # and served every session


@pytest.mark.parametrize("cluster", [1], indirect=True)
def test_full_restart_loses_nothing_acknowledged(cluster, redis_url, namespace, tmp_path):
    result = _run(cluster, redis_url, namespace, tmp_path / "logs", ("full_restart",), 20.0)
    assert result["broker"] == {"kind": "apache-kafka", "version": cluster.version, "brokers": 1}
    faults = result["broker_faults"]
    assert (faults["leader_kills"], faults["full_restarts"]) == (0, 1)
    _assert_clean(result)


@pytest.mark.parametrize("cluster", [3], indirect=True)
def test_leader_failover_keeps_serving(cluster, redis_url, namespace, tmp_path):
    result = _run(cluster, redis_url, namespace, tmp_path / "logs", ("leader_kill",), 24.0)
    assert result["broker"]["brokers"] == 3
    faults = result["broker_faults"]
    assert (faults["leader_kills"], faults["full_restarts"]) == (1, 0)
    assert faults["events"][0]["led_partitions"] > 0
    _assert_clean(result)
    # faust's own topics (the leader assignor's) are replicated like chunkserve's
    replicas = asyncio.run(_faust_topic_replicas(cluster.bootstrap, namespace))
    assert replicas and set(replicas.values()) == {3}, replicas


async def _faust_topic_replicas(bootstrap: str, namespace: str) -> dict[str, int]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        names = [t for t in await admin.list_topics() if t.startswith(namespace) and "__assignor" in t]
        return {t["topic"]: len(t["partitions"][0]["replicas"]) for t in await admin.describe_topics(names)}
    finally:
        await admin.close()
