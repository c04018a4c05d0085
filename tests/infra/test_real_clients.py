"""Ordinary Kafka clients against the embedded Apache Kafka (issue 13, item 7).

A stranger's producer, written from ``docs/asyncapi.json`` alone (topic addresses, keys,
payload schemas, documented headers; msgpack from the ``msgpack`` package, librdkafka through
``confluent-kafka``), opens sessions and pushes inputs to a running dispatch and two
workers; chunkserve's own reader and Redis then show each session placed and each input
accepted by its owner. Debian's kcat (librdkafka 2.0, whose ApiVersion handshake Tansu
fails) lists chunkserve's topics and reads the placement reports on ``metrics``.

What the document does not say is not filled in here: the producer uses the partitioner the
channels name (not librdkafka's default), and each session's records come from a producer
compressing batches with another codec (gzip, snappy, lz4, zstd), as the server's description
allows, as it allows transactions: the first session is opened in a committed one, and an
aborted one that opens it again and pushes an input must change nothing, nor stop dispatch's
group from committing past it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import msgpack
import pytest

from infra.flow import EventLog
from infra.local import LocalFleet
from schemas.codec import TYPE_HEADER, decode
from schemas.records import (Assign, Claimed, DeadLetter, InputAccepted, PlacementReport, Released,
                             RoutedInput, WorkerUp)
from schemas.topics import (DEAD_LETTERS, METRICS, SESSION_EVENTS, SESSION_INPUTS, TOPICS, WORKER_COMMANDS,
                            WORKER_EVENTS)
from streams.config import Settings
from streams.generations import SyncGenerationStore
from streams.kafka import RecordProducer
from streams.topics import ensure_topics, partition_for_key

pytestmark = pytest.mark.integration

CONTRACT = json.loads((Path(__file__).resolve().parents[2] / "docs" / "asyncapi.json").read_text())
SESSIONS, INPUTS, WORKERS = 4, 2, 2
# each session's records come from a producer compressing with one of the codecs Kafka offers
CODECS = ("gzip", "snappy", "lz4", "zstd")


def _check(schema: dict[str, Any], value: Any, path: str) -> None:
    """The part of JSON Schema the contract uses; enough for a producer to check its records."""
    if "oneOf" in schema:
        errors = []
        for option in schema["oneOf"]:
            try:
                return _check(option, value, path)
            except AssertionError as exc:
                errors.append(str(exc))
        raise AssertionError(f"{path}: matches none of oneOf: {errors}")
    kind = schema.get("type")
    types = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
             "object": dict, "array": list, "null": type(None)}
    if kind is not None:
        assert isinstance(value, types[kind]) and not (kind in ("integer", "number")
                                                        and isinstance(value, bool)), \
            f"{path}: expected {kind}, got {value!r}"
    assert "const" not in schema or value == schema["const"], f"{path}: expected {schema['const']!r}"
    assert "enum" not in schema or value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    assert "minimum" not in schema or value >= schema["minimum"], f"{path}: under {schema['minimum']}"
    assert "maximum" not in schema or value <= schema["maximum"], f"{path}: over {schema['maximum']}"
    assert "minLength" not in schema or len(value) >= schema["minLength"], f"{path}: too short"
    assert "maxLength" not in schema or len(value) <= schema["maxLength"], f"{path}: too long"
    if kind == "object":
        props = schema.get("properties", {})
        missing = set(schema.get("required", ())) - set(value)
        assert not missing, f"{path}: missing {sorted(missing)}"
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if name in props:
                _check(props[name], item, f"{path}.{name}")
            elif extra is False:
                raise AssertionError(f"{path}: unexpected field {name!r}")
            elif isinstance(extra, dict):
                _check(extra, item, f"{path}.{name}")


class ContractProducer:
    """Publishes records as the AsyncAPI document describes them, and nothing more.

    It knows the deployment's topic prefix (the document's ``{prefix}`` parameter) and the
    bootstrap servers; everything else comes from the document: which channel carries a
    message, its address, its key, its payload schema (tag and version included) and any
    header the message documents.
    """

    def __init__(self, bootstrap: str, prefix: str, contract: dict[str, Any] = CONTRACT,
                 compression: str = "none", **config: Any) -> None:
        from confluent_kafka import Producer

        self.contract = contract
        self.prefix = prefix
        # the channels name the partitioner to use (librdkafka's own default is another one)
        assert all("murmur2_random" in c["description"] for c in contract["channels"].values())
        self.producer: Any = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                                       "enable.idempotence": True, "client.id": "stranger",
                                       "linger.ms": 1, "partitioner": "murmur2_random",
                                       "compression.type": compression, **config})
        self.delivered: list[tuple[str, int, bytes]] = []  # (topic, partition, key)
        self.failed: list[str] = []
        self._channels = {ref["$ref"].rsplit("/", 1)[1]: channel
                          for channel in contract["channels"].values()
                          for ref in channel["messages"].values()}

    def send(self, title: str, **fields: Any) -> None:
        """Publish message ``title`` (e.g. ``SessionOpened``) with ``fields``."""
        message = self.contract["components"]["messages"][title]
        channel = self._channels[title]
        payload = message["payload"]
        props = payload["properties"]
        # the tag and version: the only properties the document fixes ("const", "maximum")
        wire = {name: spec["const"] for name, spec in props.items() if "const" in spec}
        wire.update({name: spec["maximum"] for name, spec in props.items()
                     if name not in wire and spec.get("description") == "schema version"})
        wire.update(fields)
        _check(payload, wire, title)
        # the key binding describes the key in words ("session id"): the field of that name
        key_field = message["bindings"]["kafka"]["key"]["description"].replace(" ", "_")
        assert key_field in props, f"{title}: no payload field for the key {key_field!r}"
        headers = [(name, str(spec["const"]).encode())
                   for name, spec in message.get("headers", {}).get("properties", {}).items()
                   if "const" in spec]
        topic = channel["address"].replace("{prefix}", self.prefix)
        self.producer.produce(topic, msgpack.packb(wire), key=str(wire[key_field]).encode(),
                              headers=headers or None, on_delivery=self._report)

    def _report(self, err: Any, msg: Any) -> None:
        if err is not None:
            self.failed.append(f"{msg.topic()}: {err}")
        else:
            self.delivered.append((msg.topic(), msg.partition(), msg.key()))

    def flush(self, timeout_s: float = 30.0) -> None:
        left = self.producer.flush(timeout_s)
        assert left == 0 and not self.failed, f"{left} undelivered; failed: {self.failed}"

    def __enter__(self) -> "ContractProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.producer.flush(5)
        self.producer = None  # the last reference: librdkafka's handle is destroyed now, not
        # left retrying the bootstrap after the session's broker has stopped


async def _uncommitted(settings: Settings, group: str, topics: tuple[str, ...],
                       timeout_s: float = 15.0) -> dict[str, tuple[int | None, int]]:
    """The partitions of ``topics`` whose committed offset for ``group`` is still short of
    their end after ``timeout_s``: {topic[partition]: (committed, end)}."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    names = {settings.topic_prefix + t: settings.partitions.get(t, 1) for t in topics}
    tps = [TopicPartition(name, p) for name, n in names.items() for p in range(n)]
    reader = AIOKafkaConsumer(**settings.kafka.client_kwargs(), group_id=group, enable_auto_commit=False,
                              isolation_level="read_committed")
    await reader.start()
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            ends = await reader.end_offsets(tps)
            short = {f"{tp.topic}[{tp.partition}]": (c, ends[tp]) for tp in tps
                     if (c := await reader.committed(tp)) != ends[tp] and ends[tp] > 0}
            if not short or time.monotonic() > deadline:
                return short
            await asyncio.sleep(0.5)
    finally:
        await reader.stop()


def _kcat(*args: str) -> bytes:
    proc = subprocess.run(["kcat", *args], capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")[-2000:]
    return proc.stdout


def _kcat_records(bootstrap: str, topic: str) -> list[tuple[bytes, dict[str, str], bytes]]:
    """Every record of ``topic`` from the beginning as kcat reads it: (key, headers, value).

    The format puts the value's size first so binary msgpack values can be split exactly."""
    out = _kcat("-C", "-b", bootstrap, "-t", topic, "-o", "beginning", "-e", "-q",
                "-f", "%S\t%k\t%h\t%s")
    records, at = [], 0
    while at < len(out):
        size_end = out.index(b"\t", at)
        size = int(out[at:size_end])
        key_end = out.index(b"\t", size_end + 1)
        head_end = out.index(b"\t", key_end + 1)
        raw_headers = out[key_end + 1:head_end].decode()
        headers = dict(h.split("=", 1) for h in raw_headers.split(",") if "=" in h)
        value = out[head_end + 1:head_end + 1 + size]
        records.append((out[size_end + 1:key_end], headers, value))
        at = head_end + 1 + size
    return records


def _needs_apache_kafka() -> None:
    if os.environ.get("CHUNKSERVE_KAFKA_IDEMPOTENCE") == "off":
        pytest.skip("the broker is Tansu: no idempotent producers, and kcat's handshake fails")
    assert shutil.which("kcat"), "Debian's kcat is missing: make tools (apt-get install kcat)"


def test_librdkafka_producer_and_kcat_against_a_running_fleet(kafka_bootstrap, redis_url,
                                                              namespace, tmp_path):
    _needs_apache_kafka()
    prefix = f"{namespace}."
    settings = Settings(topic_prefix=prefix, namespace=namespace).with_endpoints(
        kafka_bootstrap, redis_url)
    ids = [f"stranger-{i}" for i in range(SESSIONS)]
    count = settings.partitions[SESSION_INPUTS]
    stray = next(sid for sid in (f"stray-{i}" for i in range(64))
                 if zlib.crc32(sid.encode()) % count != partition_for_key(sid.encode(), count))
    fleet = LocalFleet(settings, tmp_path / "logs")
    store = SyncGenerationStore.from_url(redis_url, namespace)
    placed: dict[str, Any] = {}

    def transactions() -> None:
        """The first session opened in a committed transaction (its record at offset 0, the
        commit marker after it: faust's commit stayed at 1 there), then an aborted one that
        opens it again and pushes its first input (read uncommitted, it was acted on: the
        real input 1 then passed for a repeat)."""
        with ContractProducer(kafka_bootstrap, prefix, **{"transactional.id": f"{namespace}-tx"}) as tx:
            tx.producer.init_transactions(30)
            tx.producer.begin_transaction()
            tx.send("SessionOpened", session_id=ids[0], ts=time.time(), prompt=f"a lighthouse at dusk, {ids[0]}")
            tx.producer.commit_transaction(30)
            tx.producer.begin_transaction()
            tx.send("SessionOpened", session_id=ids[0], ts=time.time(), prompt="ABORTED open")
            tx.send("InputPushed", session_id=ids[0], seq=1, kind="text", payload="ABORTED input",
                    ts=time.time())
            tx.producer.flush(30)
            tx.producer.abort_transaction(30)

    def misplaced() -> None:
        """An input from a producer left on librdkafka's default partitioner (CRC32 of the
        key), for a key it puts elsewhere than murmur2 does: refused at once, with the
        partitioner to use (accepted before, where a recovery's replay would not find it)."""
        count = settings.partitions[SESSION_INPUTS]
        with ContractProducer(kafka_bootstrap, prefix, partitioner="consistent_random") as crc:
            crc.send("InputPushed", session_id=stray, seq=1, kind="text", payload="hi", ts=time.time())
            crc.flush()
        assert [part for _t, part, _k in crc.delivered] == [zlib.crc32(stray.encode()) % count]

    async def serve(log: EventLog, strangers: dict[str, ContractProducer]) -> None:
        """Open the sessions, push their inputs, wait until accepted; then close them."""
        transactions()
        misplaced()
        for sid in ids[1:]:
            strangers[sid].send("SessionOpened", session_id=sid, ts=time.time(),
                                prompt=f"a lighthouse at dusk, {sid}")
        # seq from 1 with no gaps: the document allows 0 and says neither (a worker waits
        # for input_seq + 1, so a seq 0 is dropped as a duplicate and a gap holds the rest)
        for seq in range(1, INPUTS + 1):
            for sid in ids:
                strangers[sid].send("InputPushed", session_id=sid, seq=seq, kind="text",
                                    payload=f"pan left #{seq}", ts=time.time())
        for stranger in strangers.values():
            stranger.flush()

        def accepted(rs: list[Any]) -> bool:
            return all(sum(isinstance(r, InputAccepted) and r.session_id == s for r in rs)
                       >= INPUTS for s in ids)

        await log.until(accepted, 30, "every input accepted")
        placed.update({sid: store.session(sid) for sid in ids})  # in Redis, while open
        for sid in ids:
            strangers[sid].send("SessionClosed", session_id=sid, ts=time.time())
        for stranger in strangers.values():
            stranger.flush()
        await log.until(lambda rs: all(any(isinstance(r, Released) and r.session_id == s
                                           and r.reason == "closed" for r in rs) for s in ids),
                        30, "sessions released on close")

    async def run() -> list[Any]:
        await ensure_topics(settings)
        fleet.start_processor("dispatch")
        for i in range(WORKERS):
            fleet.start_worker(f"worker-{i}", capacity=4, chunk_interval_s=0.05)
        async with RecordProducer(settings, client_id="audit") as audit_producer:
            log = EventLog(settings, audit_producer, (WORKER_EVENTS, METRICS, DEAD_LETTERS, WORKER_COMMANDS))
            await log.start()
            try:
                await log.until(lambda rs: len({r.worker_id for r in rs if isinstance(r, WorkerUp)})
                                >= WORKERS, 60, "workers to come up")
                with contextlib.ExitStack() as stack:
                    await serve(log, {sid: stack.enter_context(
                        ContractProducer(kafka_bootstrap, prefix, compression=codec))
                        for sid, codec in zip(ids, CODECS)})
                behind.update(await _uncommitted(settings, f"{prefix}dispatch", (SESSION_EVENTS, SESSION_INPUTS)))
                await log.pump(timeout_ms=200)
            finally:
                await log.stop()
        return log.records

    behind: dict[str, tuple[int | None, int]] = {}
    try:
        records = asyncio.run(run())
    finally:
        fleet.stop_all()
        store.client.close()

    # each session placed (claimed under its committed generation, the one Redis holds)...
    claims = {r.session_id: r for r in records if isinstance(r, Claimed) and r.session_id in ids}
    assert set(claims) == set(ids)
    for sid in ids:
        view = placed[sid]
        assert view is not None and view.state == "active" and view.claimed
        assert view.generation == claims[sid].generation and view.input_seq == INPUTS
    # ...and each input accepted once, in order, by that owner
    for sid in ids:
        got = [(r.seq, r.generation) for r in records
               if isinstance(r, InputAccepted) and r.session_id == sid]
        assert got == [(seq, claims[sid].generation) for seq in range(1, INPUTS + 1)]
    dead = [r for r in records if isinstance(r, DeadLetter)]  # every record decoded, one refused
    assert [(r.key, r.source_topic) for r in dead] == [(stray.encode(), prefix + SESSION_INPUTS)], dead
    assert "partitioner=murmur2_random" in dead[0].reason and "refused: on partition" in dead[0].reason
    # the aborted transaction's records were never acted on: what the owner was told is real
    told = [r for r in records if isinstance(r, (Assign, RoutedInput)) and r.session_id == ids[0]]
    assert any(isinstance(r, Assign) for r in told) and any(isinstance(r, RoutedInput) for r in told)
    assert not [r for r in told if "ABORTED" in (r.prompt if isinstance(r, Assign) else r.payload)]
    # and dispatch's group committed past the transaction's marker and aborted records, on
    # every partition (faust's commit stayed at 1 where a gap followed offset 0: lag for good)
    assert not behind, f"dispatch's commits short of the log's end (committed, end): {behind}"

    # kcat: the metadata listing (the ApiVersion handshake Tansu failed) shows every topic
    listing = json.loads(_kcat("-L", "-J", "-b", kafka_bootstrap))
    partitions = {t["topic"]: len(t["partitions"]) for t in listing["topics"]}
    for logical in TOPICS:
        assert partitions.get(prefix + logical) == settings.partitions.get(logical, 1), logical

    # kcat reads the placement reports on metrics: key and type header as dispatch wrote them,
    # the value a msgpack map of the documented PlacementReport schema
    reports = [(k, h, v) for k, h, v in _kcat_records(kafka_bootstrap, prefix + METRICS)
               if k == PlacementReport.TAG.encode()]
    assert reports, "no placement report on metrics"
    schema = CONTRACT["components"]["messages"]["PlacementReport"]["payload"]
    for _key, headers, value in reports:
        assert headers.get(TYPE_HEADER) == PlacementReport.TAG
        _check(schema, msgpack.unpackb(value), "PlacementReport")
        assert isinstance(decode(METRICS, value), PlacementReport)
    # reports are throttled, so not every admission has its own: the fleet, some of its sessions
    figures = [(r["workers"], r["sessions"]) for r in (msgpack.unpackb(v) for _k, _h, v in reports)]
    assert all(w == WORKERS and 0 <= n <= SESSIONS for w, n in figures), figures
    assert any(n >= 1 for _w, n in figures), figures


def test_contract_producer_partitions_inputs_where_recovery_reads_them(kafka_bootstrap, redis_url,
                                                                       namespace):
    _needs_apache_kafka()
    prefix = f"{namespace}."
    settings = Settings(topic_prefix=prefix, namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    asyncio.run(ensure_topics(settings))
    with ContractProducer(kafka_bootstrap, prefix) as stranger:
        for i in range(16):
            stranger.send("InputPushed", session_id=f"s-{i}", seq=1, kind="text", payload="hi",
                          ts=time.time())
        stranger.flush()
    count = settings.partitions[SESSION_INPUTS]
    wrong = [(key, part, partition_for_key(key, count)) for _t, part, key in stranger.delivered
             if part != partition_for_key(key, count)]
    assert not wrong, f"(key, partition written, partition recovery reads): {wrong}"
