"""Producer and consumer helpers on aiokafka, with the dead-letter path built in.

Producers use ``acks=all`` and are idempotent (a retried batch is written once, in order)
unless ``kafka.idempotence`` is off, as it is for the pip-only Tansu broker, which rejects
them (DESIGN.md §7). Delivery stays at-least-once end to end: correctness comes from
generations and per-session sequence numbers.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, AsyncIterator, Iterable, Mapping

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import (CommitFailedError, GroupAuthorizationFailedError, IllegalGenerationError,
                             IllegalStateError, InvalidProducerEpoch, OutOfOrderSequenceNumber, ProducerFenced,
                             RebalanceInProgressError, TopicAuthorizationFailedError, UnknownMemberIdError,
                             UnknownProducerId)

from schemas.codec import decoder_for, encode, bound_event_time, key_for, refused_input
from schemas.errors import AccessDeniedError, InfraError, SchemaError
from schemas.records import DeadLetter, Record
from schemas.topics import DEAD_LETTERS, TOPICS, topic_of

from .config import DEAD_LETTER_ENVELOPE_BYTES, Settings
from .prom import metrics
from .signing import record_headers
from .topics import TopicCatalogue, logical_or_physical

__all__ = ["RecordProducer", "Delivered", "RecordConsumer", "dead_letter_record", "MAX_DEAD_RAW",
           "refusal", "REFUSALS", "REJOINS", "broker_error_line", "guard_offset_fetch"]

log = logging.getLogger(__name__)
MAX_DEAD_RAW = 256 * 1024
REFUSALS = (TopicAuthorizationFailedError, GroupAuthorizationFailedError)  # what the broker's ACLs raise
# a commit the group refused because it moved on without this member (it rebalanced, or
# forgot the member while the broker was paused or away): the consumer rejoins at its next
# poll and the records polled since the last commit come again
REJOINS = (CommitFailedError, UnknownMemberIdError, IllegalGenerationError, RebalanceInProgressError,
           IllegalStateError)


def broker_error_line(exc: BaseException) -> str:
    """A broker error's text on one line: aiokafka's may span lines, and one made with more
    than one argument (CommitFailedError) prints as a tuple, its line breaks as ``\\n``."""
    said = str(exc)
    if len(exc.args) > 1:
        said = f"{type(exc).__name__}: " + "; ".join(str(a).strip() for a in exc.args if str(a).strip())
    return " ".join(said.split()) or type(exc).__name__


def guard_offset_fetch() -> None:
    """Make aiokafka's group consumers retry an OffsetFetch the group coordinator answered with
    an error for the whole request (once per process).

    From v2 on, an OffsetFetch response carries a top-level error; Kafka answers one with
    NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS and no partitions while the coordinator
    moves or reloads (a broker paused past its session and fenced, a leader change of
    ``__consumer_offsets``). aiokafka reads only the per-partition errors, takes the empty
    answer for "nothing committed", and resets every partition to ``auto_offset_reset``:
    faust's consumers started again from the beginning of their topics. Raised here as the
    error it names, its callers try again (after rediscovering the coordinator)."""
    from aiokafka import errors
    from aiokafka.consumer.group_coordinator import GroupCoordinator
    from aiokafka.protocol.commit import OffsetFetchResponse_v2, OffsetFetchResponse_v3

    if getattr(GroupCoordinator, "_chunkserve_guarded", False):
        return
    send_req = GroupCoordinator._send_req

    async def guarded(self: Any, request: Any) -> Any:
        resp = await send_req(self, request)
        code = resp.error_code if isinstance(resp, (OffsetFetchResponse_v2, OffsetFetchResponse_v3)) else 0
        if code:
            error = errors.for_code(code)
            if error in (errors.NotCoordinatorForGroupError, errors.GroupCoordinatorNotAvailableError):
                self.coordinator_dead()
            log.warning("group %s: the coordinator could not give the committed offsets (%s); asking again "
                        "(no offset reset)", self.group_id, error.__name__)
            raise error(self.group_id) if error is errors.GroupAuthorizationFailedError else error()
        return resp

    GroupCoordinator._send_req = guarded
    GroupCoordinator._chunkserve_guarded = True


def refusal(username: str | None, operation: str, what: str, exc: Exception) -> AccessDeniedError:
    """The one-line error for ``operation`` on ``what`` (a topic or a group) that the broker's
    ACLs refused the principal of SASL user ``username`` (None: a client without SASL)."""
    return AccessDeniedError(f"User:{username or 'ANONYMOUS'}", operation, what, type(exc).__name__)


# the broker no longer follows the producer's sequence (its producer state was lost with an
# unclean stop, or a batch failed between two it took): no send of that producer id to the
# partition can succeed again, and aiokafka does not take a new id by itself
SEQUENCE_LOST = (OutOfOrderSequenceNumber, UnknownProducerId, InvalidProducerEpoch, ProducerFenced)


class RecordProducer:
    """Publishes records on their own topic under their own key (at-least-once).

    An idempotent producer whose sequence the broker no longer follows (``SEQUENCE_LOST``)
    is replaced by a new one, a new producer id, and a send it refused is sent again once
    through the new one: the broker wrote nothing of it. Before, every later send to that
    partition failed the same way until the process restarted (an outside run: a producer
    and two workers after the cluster restarted, the workers resending for minutes)."""

    def __init__(self, settings: Settings, catalogue: TopicCatalogue | None = None,
                 client_id: str = "chunkserve", **overrides: Any) -> None:
        self.settings = settings
        self.catalogue = catalogue or TopicCatalogue.from_settings(settings)
        opts: dict[str, Any] = dict(acks="all", enable_idempotence=settings.kafka.idempotence == "on",
                                    linger_ms=1,
                                    client_id=client_id,
                                    max_request_size=max(settings.max_record_bytes * 2, 1 << 20))
        opts.update(overrides)
        self._opts = {**settings.kafka.client_kwargs(), **opts}
        self._producer = AIOKafkaProducer(**self._opts)
        self._broken: Any = None  # a producer a send without waiting saw refused for its sequence
        self._renewing = asyncio.Lock()
        self.renewals = 0

    async def start(self) -> "RecordProducer":
        try:
            await self._producer.start()
        except BaseException:  # closed here, not left to the collector's "Unclosed" warning
            await self._producer.stop()
            raise
        return self

    async def stop(self) -> None:
        await self._producer.stop()

    async def __aenter__(self) -> "RecordProducer":
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def _renew(self, broken: Any, exc: BaseException) -> None:
        """Put a new producer in ``broken``'s place, unless another send did already."""
        async with self._renewing:
            if self._producer is not broken:
                return
            log.warning("producer %s: the broker refused its sequence (%s): starting a new producer (a new "
                        "producer id) and sending again", self._opts.get("client_id"), type(exc).__name__)
            fresh = AIOKafkaProducer(**self._opts)
            try:
                await fresh.start()
            except BaseException:
                await fresh.stop()
                raise
            self._producer, self._broken = fresh, None
            self.renewals += 1
        try:
            await asyncio.wait_for(broken.stop(), 5.0)  # its batches fail as they are refused
        except Exception:  # noqa: BLE001 - the old producer's end is no news
            pass

    def _watch(self, fut: Any, producer: Any) -> None:
        if not fut.cancelled() and isinstance(fut.exception(), SEQUENCE_LOST):
            self._broken = producer  # the next send replaces it

    async def _send(self, topic: str, data: bytes, key: bytes | None, headers: list, wait: bool) -> Any:
        if self._broken is not None and self._broken is self._producer:
            await self._renew(self._producer, OutOfOrderSequenceNumber())
        for attempt in (0, 1):
            producer = self._producer
            try:
                if wait:
                    return await producer.send_and_wait(topic, data, key=key, headers=headers)
                fut = await producer.send(topic, data, key=key, headers=headers)
                fut.add_done_callback(lambda f, p=producer: self._watch(f, p))
                return fut
            except SEQUENCE_LOST as exc:
                if attempt:
                    raise
                await self._renew(producer, exc)
            except TopicAuthorizationFailedError as exc:
                raise refusal(self.settings.kafka.sasl_username, "write", f"topic {topic}", exc) from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def send(self, rec: Record, wait: bool = True) -> Any:
        """Encode and publish ``rec``; with ``wait`` returns once the broker acknowledged it."""
        logical = topic_of(rec)
        topic = self.catalogue.name(logical)
        data = encode(rec, self.catalogue.limit(logical))
        count_sent(self.catalogue, rec, logical)
        key = key_for(rec)
        headers = record_headers(rec.TAG, logical, key, data, self.settings.command_keys, self.settings.event_keys)
        return await self._send(topic, data, key, headers, wait)

    async def send_many(self, recs: Iterable[Record]) -> None:
        """Publish several records and wait until all are acknowledged."""
        futures = [await self.send(r, wait=False) for r in recs]
        for fut in futures:
            await fut

    async def send_raw(self, logical_topic: str, value: bytes, key: bytes | None = None) -> Any:
        """Publish bytes as they are (tools and tests that need malformed records)."""
        return await self._send(self.catalogue.name(logical_topic), value, key, [], True)

    async def flush(self) -> None:
        await self._producer.flush()


def count_sent(catalogue: TopicCatalogue, rec: Record, logical: str) -> None:
    """Count a record published on ``logical``; a dead letter also under its source topic
    (``chunkserve_records_dead_lettered_total``), whichever path refused it."""
    metrics().produced.labels(logical).inc()
    if isinstance(rec, DeadLetter):
        metrics().dead_lettered.labels(logical_or_physical(catalogue, rec.source_topic)).inc()


def dead_letter_record(topic: str, partition: int, offset: int, raw: bytes | None,
                       key: bytes | None, reason: str, consumer: str,
                       limit: int | None = None) -> DeadLetter:
    """The dead-letter record of one message that ``consumer`` could not take; its copy of
    the refused bytes is cut so the record fits ``limit`` (the dead-letters bound)."""
    raw = raw or b""
    keep = MAX_DEAD_RAW if limit is None else min(MAX_DEAD_RAW, limit - DEAD_LETTER_ENVELOPE_BYTES)
    return DeadLetter(source_topic=topic, partition=partition, offset=offset,
                      reason=reason[:1000], consumer=consumer, ts=time.time(),
                      raw=raw[:max(0, keep)], raw_size=len(raw),
                      key=None if key is None else key[:1024])


@dataclass(frozen=True, slots=True)
class Delivered:
    """A decoded record and where it was read."""

    record: Record
    topic: str
    partition: int
    offset: int
    key: bytes | None
    refused: str | None = None  # unsigned / unknown_key / forged, where commands are signed
    timestamp_ms: int | None = None  # the record's Kafka timestamp


NO_PREFIX_GRACE_S = 5.0  # topics are made together: none of the prefix by then, none is coming


def _no_topic_of_prefix(prefix: str, topics: Iterable[str]) -> None:
    """Raise, naming the setting, when the cluster holds no topic of ``prefix`` at all (a
    reader of a deployment that is not there waited out 30 s and exited 1)."""
    topics = set(topics)
    if any(t.startswith(prefix) for t in topics):
        return
    others = sorted({t[:-len(logical)] for t in topics for logical in TOPICS if t.endswith(logical)})
    there = f"; chunkserve topics there have prefix {', '.join(map(repr, others[:5]))}" if others else ""
    raise InfraError(f"no topic of prefix {prefix!r} in the cluster (CHUNKSERVE_TOPIC_PREFIX or the "
                     f"config file's topic_prefix; is the deployment up?){there}")


PASSED_OVER_MAX = 10_000  # undecodable records a read-only consumer remembers


class RecordConsumer:
    """Reads records of logical topics; bad bytes go to ``dead-letters`` and are skipped.

    Either joins ``group_id`` (subscribe) or reads explicitly ``assign``-ed partitions.
    ``poll`` returns the decoded records; ``commit`` commits everything polled so far,
    including the positions past dead-lettered records. Without a ``producer`` the consumer
    is read-only: bad bytes are counted and skipped, not published (replay, audits).
    """

    def __init__(self, settings: Settings, topics: list[str], producer: RecordProducer | None,
                 name: str, group_id: str | None = None, catalogue: TopicCatalogue | None = None,
                 **overrides: Any) -> None:
        self.settings = settings
        self.catalogue = catalogue or TopicCatalogue.from_settings(settings)
        self.topics = topics
        self.name = name
        self.producer = producer
        self.group_id = group_id
        self.dead_lettered = 0
        # a read-only consumer's records that did not decode yet name a session and an input's
        # seq and came keyed by it (schemas.codec.refused_input), as (logical topic, partition,
        # offset, session, seq): the latest PASSED_OVER_MAX, for a reader that must account
        # for each input (input_log)
        self.passed_over: deque[tuple[str, int, int, str, int]] = deque(maxlen=PASSED_OVER_MAX)
        self._commit_failing = False
        self._decoders = {self.catalogue.name(t): decoder_for(t, self.catalogue.limit(t))
                          for t in topics}
        # read_committed: what an aborted transaction of a producer wrote is never acted on
        opts: dict[str, Any] = dict(group_id=group_id, enable_auto_commit=False,
                                    auto_offset_reset="earliest", client_id=name,
                                    isolation_level="read_committed",
                                    fetch_max_wait_ms=settings.fetch_wait_ms,
                                    fetch_max_bytes=max(settings.max_record_bytes * 4, 1 << 22))
        opts.update(overrides)
        if group_id is not None:
            guard_offset_fetch()
        self._consumer = AIOKafkaConsumer(**settings.kafka.client_kwargs(), **opts)

    @property
    def raw(self) -> AIOKafkaConsumer:
        return self._consumer

    async def start(self, subscribe: bool = True) -> "RecordConsumer":
        await self._consumer.start()
        if subscribe:
            self._consumer.subscribe(list(self._decoders))
        return self

    async def partitions(self, logical: str, timeout_s: float = 30.0, deployed: bool = False) -> list[int]:
        """The partitions of ``logical`` as the cluster's metadata has them; waits while a
        topic just created is not in the metadata yet (a broker answers with it a moment
        after the creation returns). ``deployed``: the caller reads a running deployment
        (``watch``, ``replay``), so a prefix with no topic at all is named after
        ``NO_PREFIX_GRACE_S`` (a worker or processor started before the topics waits on)."""
        topic = self.catalogue.name(logical)
        deadline = time.monotonic() + timeout_s
        asked = False
        while True:
            cluster = await self._consumer._client.fetch_all_metadata()  # what topics() reads
            found = cluster.partitions_for_topic(topic)
            if found:
                return sorted(found)
            if not asked:  # a topic this principal may not Describe is left out, not refused
                asked = True
                if await self._describe_refused(topic):
                    raise refusal(self.settings.kafka.sasl_username, "describe", f"topic {topic}",
                                  TopicAuthorizationFailedError())
            if time.monotonic() > deadline:
                raise InfraError(f"topic {topic} is not in the cluster's metadata after {timeout_s:.0f}s")
            if deployed and time.monotonic() > deadline - timeout_s + NO_PREFIX_GRACE_S:
                _no_topic_of_prefix(self.catalogue.prefix, cluster.topics())
            await asyncio.sleep(0.1)

    async def _describe_refused(self, topic: str) -> bool:
        """Whether the broker refuses this principal the metadata of ``topic`` when asked for
        it by name (never creating it); False when it cannot tell."""
        from aiokafka.protocol.metadata import MetadataRequest

        client = self._consumer._client
        try:
            reply = await client.send(client.get_random_node(),
                                      MetadataRequest([topic], allow_auto_topic_creation=False))
        except Exception:  # noqa: BLE001 - an older broker or a lost connection: keep waiting
            return False
        return any(t[1] == topic and t[0] == TopicAuthorizationFailedError.errno for t in reply.topics)

    async def assign(self, partitions: Mapping[str, Iterable[int] | None],
                     start: str | int = "beginning", deployed: bool = False) -> dict[TopicPartition, int]:
        """Read the given partitions of each logical topic without a group (None: every
        partition the cluster's metadata has), from ``start``: ``"beginning"``, ``"end"``
        (skip what is there), an offset >= 0 (clamped to what each partition holds) or -n
        (the last n records of each partition). Returns each partition's end offset as of
        the assignment, for :meth:`reached`; positions are resolved before it returns, so
        nothing published afterwards is missed. An assignment replaces the previous one."""
        tps = [TopicPartition(self.catalogue.name(t), p) for t, ps in partitions.items()
               for p in (await self.partitions(t, deployed=deployed) if ps is None else ps)]
        raw = self._consumer
        raw.assign(tps)
        ends = await raw.end_offsets(tps)
        if start == "beginning":
            await raw.seek_to_beginning(*tps)
        elif start == "end":
            for tp in tps:
                raw.seek(tp, ends[tp])
        elif isinstance(start, int):
            firsts = await raw.beginning_offsets(tps)
            for tp in tps:
                at = start if start >= 0 else ends[tp] + start
                raw.seek(tp, min(max(at, firsts[tp]), ends[tp]))
        else:
            raise ValueError(f"start must be 'beginning', 'end' or an int, not {start!r}")
        for tp in tps:
            await raw.position(tp)
        return ends

    async def offset_at(self, logical: str, partition: int, timestamp_s: float) -> int | None:
        """The first offset of the partition whose Kafka timestamp is at or after
        ``timestamp_s`` (None: none is, or the broker cannot say)."""
        tp = TopicPartition(self.catalogue.name(logical), partition)
        try:
            found = await self._consumer.offsets_for_times({tp: max(0, int(timestamp_s * 1000))})
        except Exception as exc:  # noqa: BLE001 - a broker without timestamp lookups
            log.warning("%s: no offset by time on %s[%d] (%s)", self.name, tp.topic, partition, exc)
            return None
        hit = found.get(tp)
        return None if hit is None else hit.offset

    async def reached(self, ends: Mapping[TopicPartition, int]) -> bool:
        """Whether this consumer's position is at or past ``ends`` on every partition."""
        return all([await self._consumer.position(tp) >= end for tp, end in ends.items()])

    async def read_to(self, ends: Mapping[TopicPartition, int], timeout_ms: int = 200) -> AsyncIterator[Delivered]:
        """Every delivered record below ``ends`` (from :meth:`assign`), then stop."""
        while not await self.reached(ends):
            for d in await self.poll(timeout_ms=timeout_ms):
                if d.offset < ends[TopicPartition(d.topic, d.partition)]:
                    yield d

    async def stop(self) -> None:
        await self._consumer.stop()

    async def poll(self, timeout_ms: int = 200, max_records: int | None = None) -> list[Delivered]:
        """Decode the next batch; dead-letter what does not decode."""
        try:
            batches = await self._consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except REFUSALS as exc:
            what = f"group {self.group_id}" if isinstance(exc, GroupAuthorizationFailedError) else \
                f"topic {', '.join(self._decoders)}"
            raise refusal(self.settings.kafka.sasl_username, "read", what, exc) from None
        # a topic the metadata calls unauthorized has no leader to fetch from: aiokafka only
        # logs it and asks again, so the refusal is read from the metadata
        denied = sorted(self._consumer._client.cluster.unauthorized_topics & self._decoders.keys())
        if denied:
            raise refusal(self.settings.kafka.sasl_username, "read", f"topic {', '.join(denied)}",
                          TopicAuthorizationFailedError())
        out: list[Delivered] = []
        keys = self.settings.command_keys
        for tp, messages in batches.items():
            decoder = self._decoders[tp.topic]
            logical = decoder.topic
            for msg in messages:
                try:
                    rec = decoder.decode(msg.value, msg.headers)
                except SchemaError as exc:
                    await self.dead_letter(tp.topic, tp.partition, msg.offset, msg.value, msg.key,
                                           f"schema: {exc}")
                    continue
                rec, changed = bound_event_time(logical, rec, msg.timestamp)
                if changed is not None:
                    metrics().event_time_replaced.labels(logical).inc()
                    log.warning("%s: %s[%d]@%d: %s", self.name, tp.topic, tp.partition, msg.offset, changed)
                refused = keys.verify(logical, msg.value, msg.headers) or \
                    self.settings.event_keys.check(logical, rec, msg.key, msg.value, msg.headers)
                out.append(Delivered(rec, tp.topic, tp.partition, msg.offset, msg.key, refused, msg.timestamp))
                metrics().consumed.labels(topic_of(rec)).inc()
        return out

    async def dead_letter(self, topic: str, partition: int, offset: int, raw: bytes | None,
                          key: bytes | None, reason: str) -> None:
        """Publish one record this consumer could not take, with its source and reason."""
        self.dead_lettered += 1
        if self.producer is None:  # read-only: the topic's own consumers dead-letter it (once; a
            # reader counts it in ``dead_lettered``, and a replay or story says how many)
            log.debug("%s: skipping undecodable %s[%d]@%d: %s", self.name, topic, partition, offset, reason)
            logical = self.catalogue.logical(topic)
            if (named := refused_input(raw, key, self.catalogue.limit(logical))) is not None:
                self.passed_over.append((logical, partition, offset, *named))
            return
        log.warning("%s: dead-lettering %s[%d]@%d: %s", self.name, topic, partition, offset, reason)
        await self.producer.send(dead_letter_record(topic, partition, offset, raw, key, reason,
                                                    self.name, self.catalogue.limit(DEAD_LETTERS)))

    async def commit(self) -> bool:
        """Commit the positions of everything polled (group consumers only). False when the
        group moved on without this member (``REJOINS``): the consumer rejoins at its next
        poll and what was polled since the last commit is delivered again, so what the
        caller did with it must be safe to repeat. One warning when commits start failing,
        one when they succeed again."""
        if self.group_id is None:
            return True
        try:
            await self._consumer.commit()
        except REJOINS as exc:
            if not self._commit_failing:
                log.warning("%s: commit refused, the group moved on (%s); rejoining, the records since the last "
                            "commit come again", self.name, broker_error_line(exc)[:300])
            self._commit_failing = True
            return False
        if self._commit_failing:
            log.warning("%s: commits again", self.name)
            self._commit_failing = False
        return True
