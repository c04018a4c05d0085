"""The physical topic catalogue: prefixed names and partition counts, and topic creation."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.topics import TOPICS

from .config import Settings

__all__ = ["TopicCatalogue", "ensure_topics", "partition_for_key", "TOPIC_FRAMING_BYTES"]

TOPIC_FRAMING_BYTES = 4096


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


async def ensure_topics(settings: Settings) -> TopicCatalogue:
    """Create every chunkserve topic that is missing; return the catalogue."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    catalogue = TopicCatalogue.from_settings(settings)
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        # the broker enforces each topic's bound too (plus room for the batch, key and headers)
        missing = [NewTopic(catalogue.name(t), catalogue.partitions.get(t, 1), 1,
                            topic_configs={"max.message.bytes": str(catalogue.limit(t) + TOPIC_FRAMING_BYTES)})
                   for t in TOPICS if catalogue.name(t) not in existing]
        if missing:
            try:
                await admin.create_topics(missing)
            except Exception as exc:  # a racing process created them first
                if "TopicAlreadyExists" not in type(exc).__name__ + str(exc):
                    raise
    finally:
        await admin.close()
    return catalogue

