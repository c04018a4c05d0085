"""A fleet is refused in one line when its Redis does not hold its log's sessions: on the
real broker and Redis (the lost-Redis case an outside run met: the control processor counted
sessions whose state was gone as demand, and held workers for them)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid

import pytest

from schemas.errors import ConfigError
from schemas.records import SessionOpened
from streams.config import Settings
from streams.kafka import RecordProducer
from streams.log_binding import bind_store, log_extent
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration


def _settings(bootstrap: str, redis_url: str, prefix: str, namespace: str) -> Settings:
    return Settings(topic_prefix=f"{prefix}.", namespace=namespace).with_endpoints(bootstrap, redis_url)


async def _opened(settings: Settings, count: int) -> None:
    async with RecordProducer(settings) as producer:
        for i in range(count):
            await producer.send(SessionOpened(session_id=f"s{i}", ts=time.time(), prompt="p"))


def test_a_store_that_knows_nothing_of_the_log_is_refused_unless_adopted(kafka_bootstrap, redis_url, namespace):
    settings = _settings(kafka_bootstrap, redis_url, namespace, namespace)

    async def run() -> None:
        await ensure_topics(settings)
        assert await log_extent(settings) == (0, False)
        assert await bind_store(settings) == 0  # a new log: the store takes it
        await _opened(settings, 3)
        assert await bind_store(settings) == 3 and await log_extent(settings) == (3, True)
        lost = Settings(topic_prefix=settings.topic_prefix, namespace=f"{namespace}-lost").with_endpoints(
            kafka_bootstrap, redis_url)  # a Redis that lost its data: nothing in its namespace
        with pytest.raises(ConfigError) as refused:
            await bind_store(lost, sources={"redis.url": "env CHUNKSERVE_REDIS_URL"})
        said = str(refused.value)
        assert said.startswith("env CHUNKSERVE_REDIS_URL: redis.url: ") and "session-events at offset 3" in said
        assert "holds nothing" in said and "--adopt-store" in said and "\n" not in said, said
        assert await bind_store(lost, adopt=True) == 3 and await bind_store(lost) == 3

    asyncio.run(run())


def test_a_store_kept_across_topics_made_anew_is_refused(kafka_bootstrap, redis_url, namespace):
    settings = _settings(kafka_bootstrap, redis_url, namespace, namespace)

    async def run() -> None:
        from aiokafka.admin import AIOKafkaAdminClient

        await ensure_topics(settings)
        await _opened(settings, 2)
        assert await bind_store(settings, adopt=True) == 2
        admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
        await admin.start()
        try:
            await admin.delete_topics([f"{settings.topic_prefix}session-events"])
        finally:
            await admin.close()
        for _ in range(100):  # the broker deletes a topic a moment after it says so
            try:
                await ensure_topics(settings)
                if (await log_extent(settings))[0] == 0:
                    break
            except Exception:
                pass
            await asyncio.sleep(0.2)
        with pytest.raises(ConfigError) as refused:
            await bind_store(settings)
        assert "up to session-events offset 2, and they end at 0 now" in str(refused.value), refused.value

    asyncio.run(run())


def test_up_is_refused_in_one_line_on_a_redis_that_lost_the_log(kafka_bootstrap, redis_url, namespace, tmp_path):
    """`chunkserve up` says so before it starts any process, and frees its lease."""
    import os

    settings = _settings(kafka_bootstrap, redis_url, namespace, namespace)

    async def run() -> None:
        await ensure_topics(settings)
        await _opened(settings, 1)

    asyncio.run(run())
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": settings.topic_prefix, "CHUNKSERVE_NAMESPACE": f"{namespace}-{uuid.uuid4().hex[:6]}"}
    up = subprocess.run([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs")], env=env,
                        capture_output=True, text=True, timeout=120)
    said = " ".join(up.stderr.split())
    assert up.returncode == 2 and "Traceback" not in said, said
    assert "env CHUNKSERVE_REDIS_URL: redis.url: the topics of prefix" in said and "holds nothing" in said, said
    assert not (tmp_path / "logs").exists() or not any((tmp_path / "logs").iterdir())  # no process started


def test_up_refused_for_topics_made_anew_makes_no_topic_first(kafka_bootstrap, redis_url, namespace, tmp_path):
    """A store that served the prefix further than a fresh broker's topics reach: `up` refuses
    it before it makes any topic there (an outside run found all seven made on the fresh broker
    by the `up` that then refused)."""
    import os

    from streams.topics import TopicCatalogue, partition_counts

    served = _settings(kafka_bootstrap, redis_url, f"{namespace}-old", namespace)
    fresh = _settings(kafka_bootstrap, redis_url, f"{namespace}-new", namespace)

    async def run() -> None:
        await ensure_topics(served)
        await _opened(served, 2)
        assert await bind_store(served, adopt=True) == 2
        # the same store, its record of the old prefix copied onto the new one's: as if the
        # broker folder were new and the prefix kept
        from streams.generations import GenerationStore

        store = GenerationStore.from_settings(fresh)
        try:
            assert (await store.bind_log(fresh.topic_prefix, 2, True, True))[0] != "behind"
        finally:
            await store.aclose()

    asyncio.run(run())
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap, "CHUNKSERVE_REDIS_URL": redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": fresh.topic_prefix, "CHUNKSERVE_NAMESPACE": namespace}
    up = subprocess.run([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs")], env=env,
                        capture_output=True, text=True, timeout=120)
    said = " ".join(up.stderr.split())
    assert up.returncode == 2 and "they end at 0 now" in said, said
    names = [TopicCatalogue.from_settings(fresh).name(t) for t in ("session-events", "session-inputs")]
    assert asyncio.run(partition_counts(fresh, names)) == {}  # no topic made for the refused fleet
