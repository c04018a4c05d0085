"""TLS for real: aiokafka, faust and redis-py through a TLS-terminating proxy.

A Tansu broker advertises the proxy's address, so every connection a client makes (bootstrap
and partition leaders) goes through TLS. The right CA connects; an unrelated CA is refused.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlsplit

import pytest
from aiokafka.errors import KafkaError

from infra.embedded import EmbeddedTansu, free_port
from infra.local import LocalFleet
from schemas import records as r
from schemas.errors import InfraError
from schemas.topics import METRICS, SESSION_EVENTS
from streams.config import KafkaSettings, RedisSettings, Settings
from streams.generations import GenerationStore
from streams.kafka import RecordConsumer, RecordProducer
from streams.topics import ensure_topics
from tests.infra.test_agents import Reader
from tests.tls import Pki, make_pki, stunnel

pytestmark = [pytest.mark.integration, pytest.mark.tansu]


class TlsSetup:
    def __init__(self, pki: Pki, kafka_port: int, redis_url: str) -> None:
        self.pki, self.kafka_port, self.redis_url = pki, kafka_port, redis_url

    def settings(self, namespace: str, ca: Path | None = None) -> Settings:
        ca = ca or self.pki.ca
        return Settings(
            kafka=KafkaSettings(bootstrap=f"127.0.0.1:{self.kafka_port}", security_protocol="SSL",
                                ssl_cafile=str(ca), idempotence="off"),  # Tansu
            redis=RedisSettings(url=self.redis_url, ssl_ca_certs=str(ca)),
            topic_prefix=f"{namespace}.", namespace=namespace)


def _redis_route(redis_url: str, port: int) -> tuple[str, str]:
    """stunnel's target for ``redis_url`` and the rediss:// URL that reaches it through TLS."""
    parts = urlsplit(redis_url)
    auth = f"{parts.username or ''}:{parts.password or ''}@" if parts.username or parts.password else ""
    if parts.scheme == "unix":
        return parts.path, f"rediss://{auth}127.0.0.1:{port}/0"
    return f"{parts.hostname}:{parts.port or 6379}", f"rediss://{auth}127.0.0.1:{port}{parts.path or '/0'}"


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[TlsSetup]:
    folder = tmp_path_factory.mktemp("tls")
    pki = make_pki(folder / "pki")
    kafka_tls, redis_tls = free_port(), free_port()
    broker = EmbeddedTansu(log_path=folder / "tansu.log", advertised=f"127.0.0.1:{kafka_tls}")
    target, tls_url = _redis_route(redis_url, redis_tls)
    with stunnel(folder, pki, {kafka_tls: broker.bootstrap, redis_tls: target}):
        broker.start()
        try:
            yield TlsSetup(pki, kafka_tls, tls_url)
        finally:
            broker.stop()


def test_kafka_through_tls_with_the_right_ca(tls: TlsSetup, namespace: str) -> None:
    settings = tls.settings(namespace)
    sent = r.SessionOpened(session_id="tls-1", ts=time.time(), prompt="over tls")

    async def run() -> list:
        await ensure_topics(settings)
        async with RecordProducer(settings) as producer:
            await producer.send(sent)
            consumer = RecordConsumer(settings, [SESSION_EVENTS], producer, name="tls-reader",
                                      group_id=f"{namespace}-g")
            await consumer.start()
            try:
                got: list = []
                deadline = time.monotonic() + 20
                while not got and time.monotonic() < deadline:
                    got = await consumer.poll(timeout_ms=200)
                return got
            finally:
                await consumer.stop()

    got = asyncio.run(run())
    assert [d.record for d in got] == [sent]


def test_kafka_refuses_a_broker_signed_by_another_ca(tls: TlsSetup, namespace: str) -> None:
    settings = tls.settings(namespace, ca=tls.pki.other_ca)

    async def run() -> None:
        producer = RecordProducer(settings)
        try:
            await asyncio.wait_for(producer.start(), timeout=20)
        finally:
            await producer.stop()

    with pytest.raises(KafkaError):
        asyncio.run(run())


def test_redis_through_tls_with_the_right_ca_and_not_another(tls: TlsSetup, namespace: str) -> None:
    async def register(settings: Settings) -> list[str]:
        store = GenerationStore.from_settings(settings)
        try:
            await store.register_worker("w-tls", capacity=2)
            return sorted(await store.load_view())
        finally:
            await store.aclose()

    assert asyncio.run(register(tls.settings(namespace))) == ["w-tls"]
    with pytest.raises(InfraError, match="CERTIFICATE_VERIFY_FAILED"):
        asyncio.run(register(tls.settings(namespace, ca=tls.pki.other_ca)))


def test_a_faust_processor_runs_through_tls(tls: TlsSetup, namespace: str, tmp_path: Path) -> None:
    """The detector processor, started with only the environment ``child_env`` builds from
    the TLS settings, consumes session events and publishes its signal through the proxy."""
    settings = tls.settings(namespace)
    asyncio.run(ensure_topics(settings))
    fleet = LocalFleet(settings, tmp_path, extra_env={"CHUNKSERVE_DETECTOR_TICK_S": "0.5"})
    fleet.start_processor("detector")

    async def run() -> r.Record:
        async with RecordProducer(settings) as producer:
            now = time.time()
            for i in range(2):
                await producer.send(r.SessionOpened(session_id=f"tls-s{i}", ts=now))
            reader = await Reader(settings, producer, [METRICS]).start()
            try:
                return await reader.wait_for(
                    lambda x: isinstance(x, r.WorkloadSignal) and x.arrivals == 2, 60, "workload signal")
            finally:
                await reader.consumer.stop()

    try:
        signal = asyncio.run(run())
    finally:
        fleet.stop_all()
    assert signal.active == 2
