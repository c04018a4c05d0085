"""Hostile input: generated and mutated records against every topic's decoder, and a sample
through a real consumer loop, counting crashes (anything but SchemaError), hangs and
dead-lettered records.
"""

from __future__ import annotations

import dataclasses
import random
import time
import types
import typing
from typing import Annotated, Any, Literal, Union

from schemas._fields import Max, Min
from schemas.codec import Decoder, decoder_for, encode
from schemas.errors import SchemaError
from schemas.records import Record, record_types
from schemas.topics import TOPICS, topic_of

__all__ = ["random_record", "mutate", "fuzz_decoders", "fuzz_consumer", "fuzz_processors", "run",
           "PROCESSOR_INPUTS"]

HANG_S = 1.0


def _value(tp: Any, rng: random.Random) -> Any:
    origin = typing.get_origin(tp)
    if origin is Annotated:  # a value within the field's bounds (the record is built valid)
        base, *cons = typing.get_args(tp)
        lo = next((c.value for c in cons if isinstance(c, Min)), None)
        hi = next((c.value for c in cons if isinstance(c, Max)), None)
        if base in (int, float) and lo is not None and hi is not None and hi - lo <= 10**6:
            return rng.randint(int(lo), int(hi)) if base is int else rng.uniform(lo, hi)
        value = _value(base, rng)
        if base is str and not value:
            value = "x"
        if base in (int, float):
            value = abs(value)
            value = value if lo is None else max(value, base(lo))
            value = value if hi is None else min(value, base(hi))
        return value
    if tp is str:
        return "".join(rng.choice("abcdefghij-_é0123456789") for _ in range(rng.randrange(0, 12)))
    if tp is int:
        return rng.randrange(-1000, 10**6)
    if tp is float:
        return rng.uniform(-10.0, 1e4)
    if tp is bool:
        return rng.random() < 0.5
    if tp is bytes:
        return rng.randbytes(rng.randrange(0, 24))
    if origin is Literal:
        return rng.choice(typing.get_args(tp))
    if origin in (Union, types.UnionType):
        (arg,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return None if rng.random() < 0.3 else _value(arg, rng)
    if origin is dict:
        return {f"k{i}": _value(typing.get_args(tp)[1], rng) for i in range(rng.randrange(0, 3))}
    if origin is tuple:
        return tuple(_value(typing.get_args(tp)[0], rng) for _ in range(rng.randrange(0, 3)))
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp, include_extras=True)
        return tp(**{f.name: _value(hints[f.name], rng) for f in dataclasses.fields(tp)})
    raise TypeError(tp)


def random_record(rng: random.Random) -> Record:
    """A valid record of a random type."""
    cls = rng.choice(list(record_types().values()))
    hints = typing.get_type_hints(cls, include_extras=True)
    return cls(**{f.name: _value(hints[f.name], rng) for f in dataclasses.fields(cls)})


def mutate(data: bytes, rng: random.Random) -> bytes:
    """Flip, insert, delete or truncate a few bytes."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 4)):
        op, pos = rng.randrange(4), rng.randrange(len(out)) if out else 0
        if op == 0 and out:
            out[pos] = rng.randrange(256)
        elif op == 1:
            out.insert(pos, rng.randrange(256))
        elif op == 2 and out:
            del out[pos]
        else:
            out = out[: rng.randrange(len(out) + 1)]
    return bytes(out)


def fuzz_decoders(records: int, seed: int = 0) -> dict[str, Any]:
    """Decode ``records`` hostile inputs on every topic's decoder."""
    rng = random.Random(seed)
    decoders = {name: Decoder(name) for name in TOPICS}
    names = list(TOPICS)
    crashes, hangs, rejected, accepted = 0, 0, 0, 0
    examples: list[str] = []
    corpus = [encode(random_record(rng)) for _ in range(512)]
    for i in range(records):
        kind = i % 4
        if kind == 0:
            data = rng.randbytes(rng.randrange(0, 64))
        elif kind == 1:
            data = bytes([0x80 | rng.randrange(16)]) + rng.randbytes(rng.randrange(0, 64))
        else:
            data = mutate(rng.choice(corpus), rng)
        topic = names[i % len(names)]
        started = time.perf_counter()
        try:
            rec = decoders[topic].decode(data)
            accepted += topic_of(rec) == topic
        except SchemaError:
            rejected += 1
        except Exception as exc:  # a crash: the decoder let something else escape
            crashes += 1
            if len(examples) < 5:
                examples.append(f"{topic}: {data[:40]!r}: {type(exc).__name__}: {exc}")
        if time.perf_counter() - started > HANG_S:
            hangs += 1
    return {"records": records, "crashes": crashes, "hangs": hangs, "rejected": rejected,
            "accepted": accepted, "crash_examples": examples}


async def fuzz_consumer(settings: Any, records: int, seed: int = 0) -> dict[str, int]:
    """Publish ``records`` hostile records across the input topics through the real broker and
    read them with the consumer loop: every one must be processed or dead-lettered."""
    from schemas.topics import DEAD_LETTERS
    from streams.kafka import RecordConsumer, RecordProducer
    from streams.topics import ensure_topics

    rng = random.Random(seed)
    await ensure_topics(settings)
    topics = [t for t in TOPICS if t != DEAD_LETTERS]
    sent_bad = 0
    async with RecordProducer(settings, client_id="fuzz") as producer:
        for i in range(records):
            topic = topics[i % len(topics)]
            data = mutate(encode(random_record(rng)), rng) if i % 2 else rng.randbytes(rng.randrange(1, 48))
            try:
                Decoder(topic).decode(data)
            except SchemaError:
                sent_bad += 1
            await producer.send_raw(topic, data, key=b"fuzz")
        consumer = RecordConsumer(settings, topics, producer, name="fuzz-consumer")
        await consumer.start(subscribe=False)
        ends = await consumer.assign(dict.fromkeys(topics))
        good = len([d async for d in consumer.read_to(ends)])
        await consumer.stop()
    return {"consumer_records": records, "consumer_dead_lettered": consumer.dead_lettered,
            "consumer_expected_dead": sent_bad, "consumer_processed": good}


# the faust processors and the topics whose records they decode (and dead-letter); control
# folds the same topics with a group-less reader that skips what the others dead-letter
PROCESSOR_INPUTS: dict[str, tuple[str, ...]] = {
    "dispatch": ("session-events", "session-inputs", "worker-events"),
    "detector": ("session-events",),
    "metrics": ("session-events", "worker-events"),
    "control": (),
}


def _hostile(rng: random.Random, i: int) -> bytes:
    """Random bytes, a mutated valid record, or a valid record with random field values."""
    kind = i % 3
    if kind == 0:
        return rng.randbytes(rng.randrange(1, 48))
    data = encode(random_record(rng))
    return mutate(data, rng) if kind == 1 else data


async def fuzz_processors(settings: Any, records: int, log_dir: Any, seed: int = 0,
                          timeout_s: float = 180.0) -> dict[str, Any]:
    """Run every faust processor as a process, publish ``records`` hostile records on the
    topics they read, and wait until each processor dead-lettered every undecodable record it
    reads. Afterwards every processor must still run and none may have logged a traceback."""
    import asyncio
    from pathlib import Path

    from infra.flow import EventLog
    from infra.local import LocalFleet
    from schemas.records import DeadLetter
    from schemas.topics import DEAD_LETTERS
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    rng = random.Random(seed)
    await ensure_topics(settings)
    topics = sorted({t for ts in PROCESSOR_INPUTS.values() for t in ts})
    fleet = LocalFleet(settings, Path(log_dir))
    for name in PROCESSOR_INPUTS:
        fleet.start_processor(name)
    bad = {t: 0 for t in topics}
    # distinct (topic, partition, offset) per processor: a redelivery after a group rebalance
    # may dead-letter a record twice (at-least-once), which is counted apart
    letters: dict[str, set[tuple[str, int, int]]] = {name: set() for name in PROCESSOR_INPUTS}
    repeats = 0
    try:
        async with RecordProducer(settings, client_id="fuzz-processors") as producer:
            for i in range(records):
                topic = topics[i % len(topics)]
                data = _hostile(rng, i)
                try:
                    decoder_for(topic, settings.record_limit(topic)).decode(data)
                except SchemaError:
                    bad[topic] += 1
                await producer.send_raw(topic, data, key=b"fuzz-%d" % (i % 97))
            expected = {name: sum(bad[t] for t in ts) for name, ts in PROCESSOR_INPUTS.items()}
            async with EventLog(settings, producer, topics=(DEAD_LETTERS,)) as reader:
                deadline = asyncio.get_running_loop().time() + timeout_s

                def counts() -> dict[str, int]:
                    return {name: len(seen) for name, seen in letters.items()}

                while counts() != expected and asyncio.get_running_loop().time() < deadline \
                        and all(fleet.alive().values()):
                    await reader.pump(timeout_ms=200)
                    for rec in reader.records:
                        if isinstance(rec, DeadLetter) and rec.reason.startswith("schema:") and rec.consumer in letters:
                            where = (rec.source_topic, rec.partition, rec.offset)
                            repeats += where in letters[rec.consumer]
                            letters[rec.consumer].add(where)
                    reader.records.clear()
        await asyncio.sleep(1.0)  # a crash caused by the last records shows in a moment
        alive = {name: fleet.alive()[f"{name}-0"] for name in PROCESSOR_INPUTS}
    finally:
        fleet.stop_all()
    tracebacks = {name: (Path(log_dir) / f"{name}-0.log").read_text(errors="replace").count("Traceback")
                  for name in PROCESSOR_INPUTS}
    return {"processor_records": records, "processor_dead_lettered": counts(),
            "processor_dead_letter_repeats": repeats,
            "processor_expected_dead": expected, "processors_alive": alive,
            "processor_tracebacks": tracebacks}


def run(records: int, seed: int = 0, settings: Any = None, consumer_records: int = 2000,
        processor_records: int = 0) -> dict[str, Any]:
    """The benchmark result; with ``settings`` (a broker and Redis) also the consumer sample
    and the processors' sample. A processor that died, logged a traceback or did not
    dead-letter every undecodable record it reads counts as a crash (or, still running
    without finishing, a hang)."""
    import asyncio
    import tempfile

    started = time.perf_counter()
    result = fuzz_decoders(records, seed)
    out: dict[str, Any] = {"records": records, "crashes": result["crashes"], "hangs": result["hangs"],
                           "dead_lettered": result["rejected"], "accepted": result["accepted"],
                           "crash_examples": result["crash_examples"]}
    if settings is not None and consumer_records:
        sample = asyncio.run(fuzz_consumer(settings, consumer_records, seed))
        out.update(sample)
        out["records"] += consumer_records
        out["dead_lettered"] += sample["consumer_dead_lettered"]
    if settings is not None and processor_records:
        own = settings.isolated("processors")  # apart from the consumer sample above
        with tempfile.TemporaryDirectory(prefix="chunkserve-fuzz-") as logs:
            procs = asyncio.run(fuzz_processors(own, processor_records, logs, seed))
        out.update(procs)
        out["records"] += processor_records
        out["dead_lettered"] += sum(procs["processor_dead_lettered"].values())
        for name, alive in procs["processors_alive"].items():
            if not alive or procs["processor_tracebacks"][name]:
                out["crashes"] += 1
            elif procs["processor_dead_lettered"][name] != procs["processor_expected_dead"][name]:
                out["hangs"] += 1
    out["wall_s"] = round(time.perf_counter() - started, 2)
    return out
