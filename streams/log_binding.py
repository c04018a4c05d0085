"""Whether the configured Redis holds the state of the configured log: checked as a fleet starts.

The topics keep every session event; the store (Redis) keeps the sessions' generations and
snapshots. A broker folder kept across a Redis that lost its data (``redis start`` before it
kept anything, a Redis without persistence restarted) leaves sessions in the log the store
no longer knows: dispatch refuses their events and inputs one by one, and the control
processor, which rebuilds its view from the log alone, counts those it last saw executing as
demand for GPUs. The other way round, a store kept across topics made anew holds sessions the
new log never had. So the store records, per topic prefix, how far ``session-events`` had
reached (end offsets only grow while the topics live), and a fleet is refused in one line
when the two disagree (:meth:`~streams.generations.GenerationStore.bind_log`).
"""

from __future__ import annotations

from schemas.errors import ConfigError
from schemas.topics import SESSION_EVENTS

from .config import Settings

__all__ = ["bind_store", "log_extent"]


async def log_extent(settings: Settings) -> tuple[int, bool]:
    """``session-events``' end offsets summed over its partitions, and whether any record is
    still in it (retention may have removed all of them)."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    from .topics import TopicCatalogue, partition_counts

    topic = TopicCatalogue.from_settings(settings).name(SESSION_EVENTS)
    count = (await partition_counts(settings, [topic])).get(topic, 0)
    if not count:
        return 0, False
    tps = [TopicPartition(topic, p) for p in range(count)]
    consumer = AIOKafkaConsumer(**settings.kafka.client_kwargs(), enable_auto_commit=False)
    await consumer.start()
    try:
        ends = await consumer.end_offsets(tps)
        starts = await consumer.beginning_offsets(tps)
    finally:
        await consumer.stop()
    return sum(ends.values()), any(ends[tp] > starts[tp] for tp in tps)


async def bind_store(settings: Settings, *, adopt: bool = False, sources: dict[str, str] | None = None) -> int:
    """Refuse (``ConfigError`` on ``redis.url``) a store that does not hold this log's
    sessions; else record how far the log has reached and return it."""
    from .generations import GenerationStore
    from .preflight import origin

    end, retained = await log_extent(settings)
    store = GenerationStore.from_settings(settings)
    try:
        verdict, recorded = await store.bind_log(settings.topic_prefix, end, retained, adopt)
    finally:
        await store.aclose()
    topics = f"the topics of prefix {settings.topic_prefix!r}"
    if verdict == "unknown":
        raise ConfigError("redis.url", (
            f"{topics} hold session events (session-events at offset {end}) of which this Redis (namespace "
            f"{settings.namespace!r}) holds nothing: it lost its data or is another Redis, and the fleet would "
            "count sessions whose state is gone. Point at the Redis that served them (`redis start` on the same "
            "--data folder), or start both anew (a new broker folder, or another CHUNKSERVE_TOPIC_PREFIX); "
            "`up --adopt-store` takes this Redis as theirs anyway"), origin("redis.url", sources or {}))
    if verdict == "behind":
        raise ConfigError("redis.url", (
            f"this Redis (namespace {settings.namespace!r}) served {topics} up to session-events offset "
            f"{recorded}, and they end at {end} now: the topics were made anew (a new broker folder?), and "
            "its sessions are not theirs. Point at the broker that held them, or start both anew (a new "
            "`redis start --data` folder, another namespace or CHUNKSERVE_TOPIC_PREFIX)"),
            origin("redis.url", sources or {}))
    return end
