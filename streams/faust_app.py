"""The faust app factory and the record adapters that faust agents use.

faust carries bytes only (raw serializers): records are decoded by the same per-topic
decoders as everywhere else, and what does not decode goes to ``dead-letters``. Ownership
and fencing stay out of faust's machinery (its exactly-once mode and table recovery have
open bugs): agents are at-least-once and rely on generations.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import tempfile
from typing import Any

import faust
from aiokafka.errors import (ClusterAuthorizationFailedError, GroupAuthorizationFailedError,
                             TopicAuthorizationFailedError)

from schemas.codec import decoder_for, encode, bound_event_time, header_tag, key_for
from schemas.errors import AccessDeniedError, ChunkserveError, LeaseHeldError, SchemaError
from schemas.records import Record
from schemas.topics import DEAD_LETTERS, TOPICS, topic_of

from .config import Settings
from .kafka import count_sent, dead_letter_record, guard_offset_fetch, refusal
from .lease import PROCESSOR_LEASE_S, Lease, holder_of
from .store_records import LeaseAnswer
from .prom import metrics
from .signing import EVENT_REFUSALS, record_headers
from .topics import TopicCatalogue

__all__ = ["make_app", "cluster_replication", "FaustPublisher", "decode_event", "shorten_gil_switch",
           "ProcessorWorker", "PROCESSOR_LEASE_S", "start_refusal", "processor_held"]

log = logging.getLogger(__name__)

# What the patched faust methods read (the latest app's settings): how long its worker
# consumer's fetch may wait for data (``Settings.fetch_wait_ms``; faust hard-codes 1500 ms,
# and a broker that holds every fetch to its whole wait, as the embedded Tansu does, adds
# that to every hop), and whether its producer is idempotent (``kafka.idempotence``). Its
# consumer reads committed records only (faust does outside its exactly-once mode alone): a
# producer's aborted transaction is never acted on.
_TUNING: dict[str, Any] = {"fetch_wait_ms": 100, "idempotent": False}


class _ReadZero(int):
    """Offset 0 as faust's read offset, true as every other offset is."""

    def __bool__(self) -> bool:
        return True


class _ReadOffsets(dict):  # type: ignore[type-arg]
    """faust's read offsets per partition (None: nothing read), where offset 0 tests true.

    faust records a gap in a partition's offsets (a transaction's commit or abort marker, an
    aborted record read_committed skips) only after a read offset that tests true, so after
    offset 0 it recorded none: the offsets past the gap were acked but never committable, and
    the group's commit on that partition stayed at 1 for good (its lag grew, and every restart
    read it again from there; faust-streaming issue 606)."""

    def __missing__(self, key: Any) -> None:
        return None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _ReadZero(0) if value == 0 and value is not None else value)

    def update(self, *args: Any, **kwargs: Any) -> None:
        for key, value in dict(*args, **kwargs).items():
            self[key] = value


def _tune_faust(fetch_wait_ms: int, idempotent: bool) -> None:
    """faust has no setting for its worker consumer's fetch wait or isolation level, makes
    its producer idempotent only inside transactions, and stops committing a partition whose
    offset 0 is followed by a gap (``_ReadOffsets``): patch them, once per process."""
    from faust.transport.drivers import aiokafka as driver

    _TUNING.update(fetch_wait_ms=fetch_wait_ms, idempotent=idempotent)
    if getattr(driver, "_chunkserve_tuned", False):
        return
    thread, producer = driver.AIOKafkaConsumerThread, driver.Producer
    create_consumer, settings_extra = thread._create_worker_consumer, producer._settings_extra

    def create(self: Any, *args: Any, **kwargs: Any) -> Any:
        consumer = create_consumer(self, *args, **kwargs)
        consumer._fetch_max_wait_ms = _TUNING["fetch_wait_ms"]  # both read by its fetcher at start()
        consumer._isolation_level = "read_committed"
        return consumer

    def extra(self: Any) -> Any:
        settings = dict(settings_extra(self))
        if _TUNING["idempotent"]:
            settings.update(acks="all", enable_idempotence=True)
        return settings

    thread._create_worker_consumer = create
    producer._settings_extra = extra
    base, start = driver.Consumer, driver.Consumer.__init__

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        self._read_offset = _ReadOffsets(self._read_offset)

    base.__init__ = init
    driver._chunkserve_tuned = True


def shorten_gil_switch(interval_s: float = 0.0005) -> None:
    """For a processor's process: faust runs its Kafka consumer in a thread of its own and
    hands each fetch to the agents' event loop, and a thread waiting for the GIL waits up to
    the interpreter's switch interval (5 ms by default) on every such handoff."""
    sys.setswitchinterval(min(sys.getswitchinterval(), interval_s))


def cluster_replication(settings: Settings) -> int:
    """The replication factor for faust's own topics (the leader assignor's, any changelog):
    as chunkserve's topics get on this cluster, so losing a broker does not lose them.
    One when the cluster cannot be asked (faust's default)."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from aiokafka.admin import AIOKafkaAdminClient

    from .topics import broker_count, replication_for

    async def brokers() -> int:
        admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs(), request_timeout_ms=10_000)
        await admin.start()
        try:
            return await broker_count(admin)
        finally:
            await admin.close()

    try:  # a thread of its own: callers may be inside a running event loop
        with ThreadPoolExecutor(1) as pool:
            return replication_for(pool.submit(asyncio.run, brokers()).result())[0]
    except Exception as exc:  # no DescribeCluster (Tansu) or no answer: faust's default
        log.warning("could not count the cluster's brokers (%s): faust's topics get 1 replica", exc)
        return 1


def _faust_dir() -> str:
    path = os.path.join(tempfile.gettempdir(), "chunkserve-faust")
    os.makedirs(path, exist_ok=True)
    return path


def _data_dir(app: str) -> str:
    """A folder of this process's own for faust's data, removed when the process exits."""
    import atexit
    import shutil

    path = tempfile.mkdtemp(prefix=f"{app}.", dir=_faust_dir())
    atexit.register(shutil.rmtree, path, True)
    return path


def make_app(name: str, settings: Settings, **overrides: Any) -> faust.App:
    """A faust app on the configured broker, at-least-once, with no web server by default.
    faust's own topics are replicated as the cluster allows (``cluster_replication``)."""
    _tune_faust(settings.fetch_wait_ms, settings.kafka.idempotence == "on")
    guard_offset_fetch()
    opts: dict[str, Any] = dict(
        broker=f"kafka://{settings.kafka.bootstrap}",
        broker_credentials=settings.kafka.faust_credentials(),
        store="memory://",
        # faust keeps nothing there with the memory store, but makes the folder: not in the
        # caller's working directory, and gone when the process ends (one each run made, a
        # demo four, piled up in the temporary folder)
        datadir=_data_dir(f"{settings.topic_prefix}{name}"),
        web_enabled=False,
        producer_acks=-1,
        topic_allow_declare=True,
        topic_disable_leader=False,
        broker_commit_every=100,
        broker_commit_interval=0.5,
        # a replica that dies hands its partitions over after this long (Kafka's smallest
        # default group.min.session.timeout.ms): its worker deaths wait no longer for recovery
        broker_session_timeout=6.0,
        broker_heartbeat_interval=1.0,
        broker_rebalance_timeout=10.0,
        producer_max_request_size=max(settings.max_record_bytes * 2, 1 << 20),
        consumer_auto_offset_reset="earliest",
    )
    opts.update(overrides)
    if "topic_replication_factor" not in opts:
        opts["topic_replication_factor"] = cluster_replication(settings)
    return faust.App(f"{settings.topic_prefix}{name}", **opts)


def start_refusal(exc: BaseException, username: str | None) -> AccessDeniedError | None:
    """The broker's refusal that stopped a faust processor's start-up, in one line naming the
    principal (SASL user ``username``), the operation and the topic or group; None when
    ``exc`` is something else. faust creates its leader topic and subscribes its group at
    start-up; its producer is idempotent (the cluster's IdempotentWrite, which Write on any
    topic implies)."""
    said = str(exc)
    if isinstance(exc, TopicAuthorizationFailedError):
        created = re.search(r"Cannot create topic: (\S+)", said)
        if created:
            return refusal(username, "create", f"topic {created.group(1)}", exc)
        named = [", ".join(sorted(map(str, a))) for a in exc.args if isinstance(a, (set, frozenset, list, tuple))]
        return refusal(username, "read", f"topic {named[0] if named else '(unnamed)'}", exc)
    if isinstance(exc, GroupAuthorizationFailedError):
        group = next((str(a) for a in exc.args if isinstance(a, str)), "(unnamed)")
        return refusal(username, "read", f"group {group}", exc)
    if isinstance(exc, ClusterAuthorizationFailedError):
        return refusal(username, "IdempotentWrite", "the cluster (Write on any topic grants it)", exc)
    return None


async def group_refusal(settings: Settings, group: str) -> AccessDeniedError | None:
    """The broker's refusal of ``settings``' principal for consumer group ``group`` (asked
    for the group's coordinator, which needs Describe on it; Read grants that), or None. A
    faust consumer refused its group retries without a word, so this is asked first."""
    from aiokafka.client import AIOKafkaClient, CoordinationType

    kwargs = settings.kafka.client_kwargs()
    client = AIOKafkaClient(**{k: kwargs[k] for k in kwargs if k != "ssl_context"},
                            ssl_context=kwargs.get("ssl_context"))
    try:
        await client.bootstrap()
        await client.coordinator_lookup(CoordinationType.GROUP, group)
    except GroupAuthorizationFailedError as exc:
        return refusal(settings.kafka.sasl_username, "read", f"group {group}", exc)
    except Exception:  # noqa: BLE001 - anything else is faust's to meet and report
        return None
    finally:
        await client.close()
    return None




def processor_held(processor: str, prefix: str, lease: Lease, answer: LeaseAnswer,
                   lost: bool = False) -> LeaseHeldError:
    """Why a processor run alone does not run: another live process holds its lease (at
    start), or took it while this one could not refresh it (``lost``)."""
    holder, ttl = holder_of(answer.holder), lease.ttl_s
    if lost:
        said = (f"the {processor} processor of topic prefix {prefix!r} was taken over by another ({holder}) "
                f"while this one could not refresh its lease for {ttl:g} s; this one stopped; run one per topic prefix")
    else:
        said = (f"a {processor} processor of topic prefix {prefix!r} is running already ({holder}); run one per "
                f"topic prefix (one that stopped without a clean shutdown frees its place within {ttl:g} s)")
    return LeaseHeldError(lease.name, holder, said)


class ProcessorWorker(faust.Worker):
    """faust's worker, except that a start-up the broker's ACLs refuse (its group, asked
    first with ``settings``; its leader topic; its producer) ends quietly with ``refused``
    set (the caller reports it in one line) instead of faust's logged traceback or, for the
    group, a silent wait. With ``lease`` (a processor's name) one process runs it per topic
    prefix: a second is refused before its agents start (``refused``: LeaseHeldError), and
    one whose lease another process took stops."""

    refused: ChunkserveError | None = None

    def __init__(self, app: faust.App, *args: Any, settings: Settings | None = None, lease: str | None = None,
                 **kwargs: Any) -> None:
        super().__init__(app, *args, **kwargs)
        self._settings = settings
        self._processor = lease
        self._lease: Lease | None = None
        self._keeping: asyncio.Future[None] | None = None

    async def start(self) -> None:
        if self._settings is not None:
            self.refused = await group_refusal(self._settings, self.app.conf.id)
            if self.refused is not None:
                raise asyncio.CancelledError()
        try:
            await super().start()
        except Exception as exc:  # noqa: BLE001 - a refusal is kept, anything else goes on to faust
            refused = start_refusal(exc, getattr(self.app.conf.broker_credentials, "username", None))
            if refused is None:
                raise
            self.refused = refused
            raise asyncio.CancelledError() from None  # faust's worker stops without a traceback

    async def on_first_start(self) -> None:
        """faust's, then the lease (its signal handlers are in: a SIGTERM while it waits for
        the lease stops it cleanly), before the app and its agents start."""
        await super().on_first_start()
        if self._settings is not None and self._processor is not None:
            self.refused = await self._take_lease(self._settings, self._processor)
            if self.refused is not None:
                raise asyncio.CancelledError()

    async def _take_lease(self, settings: Settings, processor: str) -> LeaseHeldError | None:
        from .generations import GenerationStore

        lease = Lease(GenerationStore.from_settings(settings), f"{processor}:{settings.topic_prefix}",
                      PROCESSOR_LEASE_S)
        self._lease = lease  # a stop meanwhile frees what the take may have taken
        answer = await lease.take()
        if not answer.ours:
            self._lease = None
            await lease.store.aclose()
            return processor_held(processor, settings.topic_prefix, lease, answer)
        self._keeping = asyncio.ensure_future(self._keep_lease(lease))
        return None

    async def _keep_lease(self, lease: Lease) -> None:
        taken = await lease.keep(asyncio.Event(), PROCESSOR_LEASE_S / 5)
        if taken is not None and self._settings is not None and self._processor is not None:
            self.refused = processor_held(self._processor, self._settings.topic_prefix, lease, taken, lost=True)
            log.error("%s", self.refused)
            await self.stop()
            if self._starting_fut is not None:  # as a signal stops it: the caller reports ``refused``
                self._starting_fut.cancel()

    async def stop(self) -> None:
        """Stop faust (its agents' last records out), then free the lease, unless another
        process holds it now."""
        await super().stop()
        lease, self._lease = self._lease, None
        if lease is None:
            return
        if self._keeping is not None and self._keeping is not asyncio.current_task():
            self._keeping.cancel()
        if not isinstance(self.refused, LeaseHeldError):
            await lease.release()
        await lease.store.aclose()


class FaustPublisher:
    """Publishes records through a faust app's producer, on their own topic and key."""

    def __init__(self, app: faust.App, catalogue: TopicCatalogue, keys: Any = None, event_keys: Any = None) -> None:
        from .signing import CommandKeys, EventKeys

        self._keys = keys if keys is not None else CommandKeys.from_env()
        self.event_keys = event_keys if event_keys is not None else EventKeys.from_env()
        self._app = app
        self._username = getattr(app.conf.broker_credentials, "username", None)  # SASL's, for refusals
        self._catalogue = catalogue
        self._topics = {
            name: app.topic(catalogue.name(name), value_serializer="raw", key_serializer="raw",
                            partitions=catalogue.partitions.get(name, 1))
            for name in TOPICS
        }

    def topic(self, logical: str) -> Any:
        return self._topics[logical]

    def limit(self, logical: str) -> int:
        """The record-size bound of ``logical`` in this deployment."""
        return self._catalogue.limit(logical)

    async def send(self, rec: Record, wait: bool = False) -> Any:
        logical = topic_of(rec)
        value = encode(rec, self._catalogue.limit(logical))
        key = key_for(rec)
        headers = record_headers(rec.TAG, logical, key, value, self._keys, self.event_keys)
        try:
            fut = await self._topics[logical].send(key=key, value=value, headers=headers)
        except TopicAuthorizationFailedError as exc:
            raise refusal(self._username, "write",
                          f"topic {self._catalogue.name(logical)}", exc) from None
        count_sent(self._catalogue, rec, logical)
        if wait:
            return await fut
        return fut

    async def dead_letter(self, message: Any, reason: str, consumer: str) -> None:
        """Publish a record this processor refused (undecodable, or refused for what it says),
        with its source and reason."""
        log.warning("%s: dead-lettering %s[%s]@%s: %s", consumer, message.topic,
                    message.partition, message.offset, reason)
        await self.send(dead_letter_record(message.topic, message.partition, message.offset,
                                           message.value, message.key, reason, consumer,
                                           self.limit(DEAD_LETTERS)))




def _event_time_replaced(logical: str, consumer: str, why: str) -> None:
    metrics().event_time_replaced.labels(logical).inc()
    log.warning("%s: %s: %s", consumer, logical, why)


async def decode_event(event: Any, logical: str, publisher: FaustPublisher,
                       consumer: str, wanted: frozenset[str] | None = None) -> Record | None:
    """Decode one faust event of ``logical`` topic, or dead-letter it and return None.

    With ``wanted`` (type tags), a record whose type header names another type is passed
    over undecoded (None): a processor that acts on a few kinds of a busy topic does not pay
    to decode every chunk and heartbeat on it.
    """
    if wanted is not None:
        tag = header_tag(event.message.headers)
        if tag is not None and tag not in wanted:
            return None
    try:
        rec = decoder_for(logical, publisher.limit(logical)).decode(event.message.value, event.message.headers)
    except SchemaError as exc:
        await publisher.dead_letter(event.message, f"schema: {exc}", consumer)
        return None
    msg = event.message
    if (refused := publisher.event_keys.check(logical, rec, msg.key, msg.value, msg.headers)) is not None:
        # not written by the worker it is keyed by and speaks for (nor by a process that holds the masters)
        await publisher.dead_letter(msg, f"refused: {EVENT_REFUSALS[refused]}", consumer)
        return None
    stamp = event.message.timestamp  # faust keeps the broker's timestamp in seconds
    rec, changed = bound_event_time(logical, rec, stamp * 1000.0 if stamp else None)
    if changed is not None:
        _event_time_replaced(logical, consumer, changed)
    metrics().consumed.labels(logical).inc()
    return rec
