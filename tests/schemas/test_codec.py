"""Wire contracts: round trips, and SchemaError (only) for every kind of bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from pathlib import Path

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.bench.fuzz import mutate
from schemas.asyncapi import asyncapi_json
from schemas.codec import Decoder, decode, encode, key_for
from schemas.errors import SchemaError
from schemas.records import (Assign, ChunkDone, Generation, InputPushed, Record, SessionOpened,
                             record_types)
from schemas.topics import TOPICS, topic_of

from .strategies import ALL_RECORDS

ROOT = Path(__file__).resolve().parents[2]


@settings(max_examples=600, deadline=None)
@given(ALL_RECORDS)
def test_round_trip_every_type(rec: Record) -> None:
    topic = topic_of(rec)
    assert decode(topic, encode(rec)) == rec
    assert isinstance(key_for(rec), bytes) and key_for(rec)


def test_every_record_type_is_on_exactly_one_topic() -> None:
    on_topics = [cls for spec in TOPICS.values() for cls in spec.records]
    assert sorted(c.TAG for c in on_topics) == sorted(record_types())
    assert len(on_topics) == len(set(on_topics))


def test_records_are_frozen_and_slotted() -> None:
    rec = SessionOpened(session_id="s1", ts=1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.session_id = "s2"  # type: ignore[misc]
    assert not hasattr(rec, "__dict__")


def _valid_wire() -> dict:
    return {"t": "cmd.assign", "v": 1, "worker_id": "w1", "session_id": "s1",
            "generation": {"worker_id": "w1", "epoch": 2}, "ts": 1.5}


@pytest.mark.parametrize(
    ("change", "field", "needle"),
    [
        (lambda w: w.update(t="cmd.nope"), "t", "unknown type tag"),
        (lambda w: w.pop("t"), "t", "type tag"),
        (lambda w: w.update(v=9), "v", "unsupported version"),
        (lambda w: w.update(v=True), "v", "version"),
        (lambda w: w.pop("session_id"), "session_id", "missing field"),
        (lambda w: w.update(extra=1), "extra", "unexpected field"),
        (lambda w: w.update(ts="soon"), "ts", "expected a number"),
        (lambda w: w.update(session_id=""), "session_id", "must not be empty"),
        (lambda w: w.update(worker_id=7), "worker_id", "expected a string"),
        (lambda w: w["generation"].update(epoch=-1), "generation.epoch", ">= 0"),
        (lambda w: w["generation"].update(epoch=1.0), "generation.epoch", "integer"),
        (lambda w: w.update(ts=math.inf), "ts", "not finite"),
        (lambda w: w.update(ts=-1.0), "ts", ">= 0"),
        (lambda w: w.update(restore=1), "restore", "boolean"),
        (lambda w: w.update(generation=[1, 2]), "generation", "expected a map"),
    ],
)
def test_schema_error_names_field(change, field: str, needle: str) -> None:
    wire = _valid_wire()
    change(wire)
    with pytest.raises(SchemaError) as info:
        decode("worker-commands", msgpack.packb(wire, use_bin_type=True))
    assert info.value.field == field
    assert needle in str(info.value)


def test_negative_seq_and_wrong_topic() -> None:
    good = InputPushed(session_id="s", seq=1, kind="text", payload="hi", ts=0.0)
    wire = msgpack.unpackb(encode(good))
    for bad in (-3, 0):  # a session's inputs are numbered from 1 (the contract's minimum)
        wire["seq"] = bad
        with pytest.raises(SchemaError, match=f"seq: must be >= 1, got {bad}"):
            decode("session-inputs", msgpack.packb(wire))
    with pytest.raises(SchemaError, match="unknown type tag"):
        decode("session-events", encode(good))


def test_a_seq_past_2_53_is_refused_by_the_schema() -> None:
    """A producer's seq is at most 2**53 - 1 (exact in every JSON number and in the store)."""
    wire = msgpack.unpackb(encode(InputPushed(session_id="s", seq=1, kind="text", payload="hi", ts=0.0)))
    wire["seq"] = 2**53 - 1
    assert decode("session-inputs", msgpack.packb(wire)).seq == 2**53 - 1
    wire["seq"] = 2**53
    with pytest.raises(SchemaError, match="seq: must be <= 9007199254740991, got 9007199254740992"):
        decode("session-inputs", msgpack.packb(wire))


def test_size_limit_is_configurable() -> None:
    rec = SessionOpened(session_id="s", ts=0.0, prompt="x" * 5000)
    data = encode(rec)
    assert decode("session-events", data) == rec
    with pytest.raises(SchemaError, match="over the 1000-byte limit"):
        Decoder("session-events", max_bytes=1000).decode(data)
    with pytest.raises(SchemaError, match="limit"):
        encode(rec, max_bytes=100)


def test_invalid_records_cannot_be_built() -> None:
    with pytest.raises(SchemaError, match="chunk_index"):
        ChunkDone(worker_id="w", session_id="s", generation=Generation("w", 1), chunk_index=-1, ts=0)
    with pytest.raises(SchemaError, match="epoch"):
        Generation("w", -1)
    with pytest.raises(SchemaError, match="worker_id"):
        Assign(worker_id="", session_id="s", generation=Generation("w", 1), ts=0.0)
    from schemas.records import WorkloadSignal

    for level in (0, 11):  # the detector's levels are 1..10, as the contract now says (it allowed 0 and up)
        with pytest.raises(SchemaError, match="level"):
            WorkloadSignal(ts=0.0, window_s=60.0, active=0, arrivals=0, departures=0, to_idle=0, to_active=0,
                           volatility=0.0, level=level)


def _decode_or_schema_error(topic: str, data: bytes) -> None:
    try:
        rec = decode(topic, data)
    except SchemaError:
        return
    assert topic_of(rec) == topic  # a lucky mutation may still be a valid record


def test_random_bytes_raise_schema_error_only() -> None:
    rng = random.Random(1234)
    topics = list(TOPICS)
    for i in range(10_000):
        data = rng.randbytes(rng.randrange(0, 96))
        if i % 3 == 0:  # start like a msgpack map to get past the first byte
            data = bytes([0x80 | rng.randrange(16)]) + data
        _decode_or_schema_error(topics[i % len(topics)], data)


@settings(max_examples=60, deadline=None)
@given(ALL_RECORDS, st.randoms(use_true_random=False))
def test_mutations_raise_schema_error_only(rec: Record, rng: random.Random) -> None:
    topic = topic_of(rec)
    base = encode(rec)
    for _ in range(170):  # 60 records x 170 mutations > 10,000
        _decode_or_schema_error(topic, mutate(base, rng))


def test_asyncapi_document_is_current() -> None:
    committed = (ROOT / "docs" / "asyncapi.json").read_text()
    assert committed == asyncapi_json(), "run `chunkserve schemas asyncapi -o docs/asyncapi.json`"
    doc = json.loads(committed)
    assert set(doc["channels"]) == set(TOPICS)
    assert set(doc["components"]["messages"]) == {c.__name__ for c in record_types().values()}


def test_asyncapi_security_schemes_are_the_mechanisms_clients_offer() -> None:
    from schemas.asyncapi import SASL_SCHEMES, asyncapi_document
    from streams.config import _SASL_MECHANISMS

    doc = asyncapi_document()
    assert sorted(SASL_SCHEMES.values()) == sorted(_SASL_MECHANISMS)
    schemes = doc["components"]["securitySchemes"]
    assert {name: v["type"] for name, v in schemes.items()} == {name: name for name in SASL_SCHEMES}
    refs = [r["$ref"].rsplit("/", 1)[1] for r in doc["servers"]["cluster-sasl-ssl"]["security"]]
    assert refs == list(schemes) and "security" not in doc["servers"]["cluster"]


def test_type_header_names_the_record_type():
    from schemas.codec import TYPE_HEADER, header_tag

    assert header_tag([("cs-kid", b"k1"), (TYPE_HEADER, b"evt.chunk")]) == "evt.chunk"
    assert header_tag({TYPE_HEADER: b"evt.hb"}) == "evt.hb"
    assert header_tag(None) is None and header_tag([]) is None
    assert header_tag([(TYPE_HEADER, "not bytes")]) is None


def test_bytes_that_are_not_msgpack_say_so_without_a_dangling_colon():
    from schemas.codec import decode
    from schemas.errors import SchemaError

    with pytest.raises(SchemaError) as got:
        decode("session-events", b"\xc1 not msgpack")
    assert str(got.value).startswith("not msgpack: ") and not str(got.value).rstrip().endswith(":"), str(got.value)


def test_a_session_record_keyed_by_anything_but_its_session_is_misfiled() -> None:
    from schemas.records import InputPushed, SessionOpened, WorkerUp
    from schemas.topics import misfiled

    opened = SessionOpened(session_id="s1", ts=1.0)
    assert misfiled(opened, b"s1") is None
    assert misfiled(opened, b"s2").startswith("key 's2': not the session id 's1'")  # no bytes repr (b'...')
    assert misfiled(opened, None).startswith("no key: not the session id 's1'")
    assert misfiled(InputPushed(session_id="s1", seq=1, kind="text", payload="x", ts=1.0), b"x") is not None
    assert misfiled(WorkerUp(worker_id="w", ts=1.0, capacity=1), b"other") is None  # keyed by worker id: not checked here


def test_a_type_header_naming_another_type_than_the_record_is_refused() -> None:
    from schemas.codec import TYPE_HEADER, decoder_for
    from schemas.records import SessionClosed, SessionOpened

    raw = encode(SessionOpened(session_id="s", ts=1.0))
    dec = decoder_for("session-events")
    assert dec.decode(raw).TAG == dec.decode(raw, [(TYPE_HEADER, SessionOpened.TAG.encode())]).TAG
    with pytest.raises(SchemaError, match="header says 'session.closed' but the record is 'session.opened'"):
        dec.decode(raw, [(TYPE_HEADER, SessionClosed.TAG.encode())])


def test_a_type_header_given_twice_is_refused_whichever_comes_first() -> None:
    """Only the first was checked: [opened, closed] passed and [closed, opened] did not, and a
    reader taking the last header (Java's lastHeader) would read another type."""
    from schemas.codec import TYPE_HEADER, decoder_for, header_tag
    from schemas.records import SessionClosed, SessionOpened

    raw = encode(SessionOpened(session_id="s", ts=1.0))
    dec = decoder_for("session-events")
    for first, second in ((SessionOpened, SessionClosed), (SessionClosed, SessionOpened), (SessionOpened, SessionOpened)):
        headers = [(TYPE_HEADER, first.TAG.encode()), (TYPE_HEADER, second.TAG.encode())]
        assert header_tag(headers) is None  # a processor passing records over by type decodes it
        with pytest.raises(SchemaError, match="the cs-t header is given 2 times"):
            dec.decode(raw, headers)


def test_a_field_given_twice_in_a_record_is_refused() -> None:
    """msgpack maps may repeat a key; the last one won, silently (another reader may take
    the first). Nested maps (a generation) are held to it too."""
    import msgpack

    from schemas.codec import decoder_for

    dec = decoder_for("session-events")
    good = msgpack.packb({"t": "session.opened", "v": 1, "session_id": "a", "ts": 1.0})
    assert dec.decode(good).session_id == "a"
    # written by hand: packb cannot give a key twice
    body = b"".join(msgpack.packb(x) for x in ("t", "session.opened", "v", 1, "session_id", "a",
                                               "session_id", "b", "ts", 1.0))
    twice = bytes([0x80 | 5]) + body
    with pytest.raises(SchemaError, match="the map gives the key 'session_id' twice"):
        dec.decode(twice)
    cmds = decoder_for("worker-commands")
    gen = bytes([0x80 | 3]) + b"".join(msgpack.packb(x) for x in ("worker_id", "w", "epoch", 1, "epoch", 2))
    assign = bytes([0x80 | 6]) + b"".join(msgpack.packb(x) for x in ("t", "cmd.assign", "v", 1, "worker_id", "w",
                                                                       "session_id", "s")) \
        + msgpack.packb("generation") + gen + msgpack.packb("ts") + msgpack.packb(1.0)
    with pytest.raises(SchemaError, match="the map gives the key 'epoch' twice"):
        cmds.decode(assign)


def test_a_refused_input_that_gives_its_seq_twice_names_no_seq() -> None:
    """A refused input's bytes name the seq counted as refused (its owner does not wait for it):
    one giving ``seq`` twice (2, then 3) was counted as seq 3, which the producer never sent, so
    input 4 was applied without waiting for the real 3, which was then refused as late (an
    outside producer). It names its session and no seq, as one whose seq is not a whole number."""
    import msgpack

    from schemas.codec import names, refused_input

    def input_map(*pairs: object) -> bytes:
        return bytes([0x80 | (len(pairs) // 2)]) + b"".join(msgpack.packb(x) for x in pairs)

    head = ("t", "input.pushed", "v", 1, "session_id", "b", "kind", "text", "payload", "x", "ts", 1.0)
    assert names(input_map(*head, "seq", 2, "seq", 3)) == ("b", None)
    assert refused_input(input_map(*head, "seq", 2, "seq", 3), b"b") is None
    assert refused_input(input_map(*head, "seq", 3), b"b") == ("b", 3)
    assert names(input_map("session_id", "a", "session_id", "b", "seq", 3)) is None  # whose input, then?
    assert names(msgpack.packb(["session_id", "b"])) is None  # not a map
