"""The physical topic catalogue: prefixed names and partition counts, and topic creation."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from schemas.errors import ConfigError
from schemas.topics import SESSION_INPUTS, TOPIC_FRAMING_BYTES, TOPICS

from .config import Settings

__all__ = ["TopicCatalogue", "ensure_topics", "require_topics", "partition_for_key", "misplaced", "replication_for", "broker_count",
           "until_led", "logical_or_physical", "partition_counts",
           "TOPIC_FRAMING_BYTES"]

_TOPIC_AUTHORIZATION_FAILED = 29

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopicCatalogue:
    """Maps logical topic names (``session-events``) to physical ones (``{prefix}session-events``)."""

    prefix: str
    partitions: dict[str, int]
    limits: dict[str, int]

    @classmethod
    def from_settings(cls, settings: Settings) -> "TopicCatalogue":
        return cls(settings.topic_prefix, dict(settings.partitions),
                   {t: settings.record_limit(t) for t in TOPICS})

    def limit(self, logical: str) -> int:
        """The most bytes one record of ``logical`` may take in this deployment."""
        return self.limits[logical]

    def name(self, logical: str) -> str:
        if logical not in TOPICS:
            raise KeyError(f"unknown topic {logical!r}")
        return self.prefix + logical

    def logical(self, physical: str) -> str:
        if not physical.startswith(self.prefix) or physical[len(self.prefix):] not in TOPICS:
            raise KeyError(f"{physical!r} is not a chunkserve topic under prefix {self.prefix!r}")
        return physical[len(self.prefix):]

    def all(self) -> dict[str, int]:
        """Physical name -> partition count of every topic."""
        return {self.name(t): self.partitions.get(t, 1) for t in TOPICS}


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default key partitioner (murmur2), as producers use it."""
    from aiokafka.partitioner import murmur2

    return (murmur2(key) & 0x7FFFFFFF) % partitions


def misplaced(key: bytes | None, partition: int, partitions: int | None) -> str | None:
    """Why a keyed record on ``partition`` of a topic of ``partitions`` is not where the
    contract's partitioner puts it, or None (unkeyed, one partition, or count unknown)."""
    if key is None or partition < 0 or not partitions or partitions < 2:
        return None
    want = partition_for_key(key, partitions)
    if partition == want:
        return None
    return (f"on partition {partition}, but its key hashes to partition {want} of {partitions} (murmur2, "
            "Kafka's default partitioner; librdkafka producers need partitioner=murmur2_random): "
            "a recovery reads a session's inputs from its key's partition only")


def replication_for(brokers: int) -> tuple[int, int]:
    """``(replication factor, min.insync.replicas)`` on a cluster of ``brokers``: three copies
    where there are three brokers, and an acknowledged write on two of them."""
    factor = max(1, min(3, brokers))
    return factor, (2 if factor >= 3 else 1)


# session-inputs: the broker stamps each input as it appends it, so the rate rule's windows
# (schemas.input_rate) follow the log's order and a producer cannot spread its inputs over
# windows by the timestamps it sets
TOPIC_CONFIGS = {SESSION_INPUTS: {"message.timestamp.type": "LogAppendTime"}}


async def ensure_topics(settings: Settings) -> TopicCatalogue:
    """Create every chunkserve topic that is missing, replicated as the cluster allows;
    return the catalogue."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    catalogue = TopicCatalogue.from_settings(settings)
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        factor, isr = replication_for(await broker_count(admin))
        # the broker enforces each topic's bound too (plus room for the batch, key and headers)
        missing = [NewTopic(catalogue.name(t), catalogue.partitions.get(t, 1), factor,
                            topic_configs={"max.message.bytes": str(catalogue.limit(t) + TOPIC_FRAMING_BYTES),
                                           **({"min.insync.replicas": str(isr)} if isr > 1 else {}),
                                           **TOPIC_CONFIGS.get(t, {})})
                   for t in TOPICS if catalogue.name(t) not in existing]
        refused: set[str] = set()
        if missing:
            try:
                resp = await admin.create_topics(missing)
            except Exception as exc:  # a racing process created them first
                if "TopicAlreadyExists" not in type(exc).__name__ + str(exc):
                    raise
            else:
                # a principal under ACLs sees only its own topics and may create none: the
                # admin created them (or a missing one fails where it is used, by name)
                refused = {name for name, code, *_ in resp.topic_errors
                           if code == _TOPIC_AUTHORIZATION_FAILED}
    finally:
        await admin.close()
    created = {t.name: t.num_partitions for t in missing if t.name not in refused}
    if created:
        await until_led(settings.kafka.client_kwargs(), created)
    return catalogue


async def partition_counts(settings: Settings, names: list[str]) -> dict[str, int]:
    """How many partitions each of these topics has on the broker (as it says, not as
    configured: a topic made before keeps its count); a topic it does not list is left out."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        return {t["topic"]: len(t["partitions"]) for t in await admin.describe_topics(names)
                if t.get("error_code", 0) == 0 and t["partitions"]}
    finally:
        await admin.close()


async def until_led(client: dict[str, Any], topics: dict[str, int], timeout_s: float = 30.0) -> None:
    """Wait until the leaders of new topics' partitions answer for them: Kafka lists a new
    partition's leader a moment before that broker serves it, and a client that asks in
    between gets NotLeaderForPartition (retried, but logged as an error)."""
    import asyncio
    import logging

    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(**client, enable_auto_commit=False)
    fetcher = logging.getLogger("aiokafka.consumer.fetcher")
    level = fetcher.level
    fetcher.setLevel(logging.CRITICAL)
    await consumer.start()
    try:
        tps = [TopicPartition(name, p) for name, n in topics.items() for p in range(n)]
        await asyncio.wait_for(consumer.end_offsets(tps), timeout_s)
    finally:
        fetcher.setLevel(level)
        await consumer.stop()


async def broker_count(admin: object) -> int:
    """How many brokers the cluster lists, through a started admin client: its metadata asked
    again, else as the client's start read it (every broker answers that). Before, any
    error (a timeout, a refusal) read as one broker, and a three-broker cluster that did not
    answer in time got every topic with one replica, without a word."""
    try:
        return len((await admin.describe_cluster())["brokers"])  # type: ignore[attr-defined]
    except Exception as exc:  # noqa: BLE001 - asked again below, from what the start read
        known = len(admin._client.cluster.brokers())  # type: ignore[attr-defined]
        log.warning("could not ask the cluster for its brokers (%s): counting the %d its metadata "
                    "listed at start", exc, known)
        return max(1, known)


def logical_or_physical(catalogue: TopicCatalogue, physical: str) -> str:
    """The logical name of a topic of ``catalogue`` (a metric's label), else the name as given."""
    try:
        return catalogue.logical(physical)
    except KeyError:
        return physical


async def require_topics(settings: Settings, logical: list[str], who: str) -> None:
    """Refuse in one line (``ConfigError`` naming the prefix setting) when a topic ``who``
    writes is not on the broker: a client on another prefix, refused before its first send's
    40 s metadata wait (and, for ``handoff``, 394 lines of aiokafka's warnings)."""
    catalogue = TopicCatalogue.from_settings(settings)
    names = [catalogue.name(t) for t in logical]
    missing = [n for n in names if n not in await partition_counts(settings, names)]
    if missing:
        raise ConfigError("topic_prefix", f"no topic {', '.join(missing)} on the broker: the fleet's prefix "
                          "differs (CHUNKSERVE_TOPIC_PREFIX, or the file CHUNKSERVE_CONFIG names), or "
                          "`chunkserve topics` has not made them", who)
