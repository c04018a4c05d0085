"""msgpack encoding and one decoder per topic.

``decode`` raises ``SchemaError`` and nothing else: for bytes that are not msgpack, an
unknown tag, an unsupported version, missing or unexpected fields, wrong types, empty ids,
negative epochs or seqs, non-finite numbers, and payloads over the size limit.
"""

from __future__ import annotations

from dataclasses import replace

import functools
from typing import Any

import msgpack

from ._fields import MAX_SEQ, from_fields, to_fields
from .errors import SchemaError
from .records import Record
from .topics import SESSION_EVENTS, SESSION_INPUTS, TOPICS, topic_of

__all__ = ["DEFAULT_MAX_BYTES", "encode", "decode", "Decoder", "decoder_for", "key_for",
           "bound_event_time", "EVENT_TIME_TOPICS", "MAX_EVENT_SKEW_S",
           "TYPE_HEADER", "header_tag", "names", "refused_input"]

DEFAULT_MAX_BYTES = 1024 * 1024
TAG, VERSION = "t", "v"
# Kafka header carrying a record's type tag, so a consumer can pass over records it does not
# act on without decoding them; advisory only: what a consumer acts on is always decoded
TYPE_HEADER = "cs-t"


def _header_tags(headers: Any) -> list[str]:
    """Every type tag in a message's headers (a list of pairs or a mapping)."""
    if not headers:
        return []
    pairs = headers.items() if hasattr(headers, "items") else headers
    return [bytes(value).decode("ascii", "replace") for name, value in pairs
            if name == TYPE_HEADER and isinstance(value, (bytes, bytearray))]


def header_tag(headers: Any) -> str | None:
    """The type tag in a message's headers, if there is one (and only one: a record that
    gives two is decoded, and refused there)."""
    tags = _header_tags(headers)
    return tags[0] if len(tags) == 1 else None


def _unique_keys(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    """A msgpack map whose keys are all different (a field given twice is refused, not read
    as whichever came last: another reader may take the first)."""
    made = dict(pairs)
    if len(made) != len(pairs):
        seen: set[Any] = set()
        for key, _ in pairs:
            if key in seen:
                raise _TwiceError(f"the map gives the key {str(key)[:64]!r} twice")
            seen.add(key)
    return made


class _TwiceError(ValueError):
    pass


def names(data: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, int | None] | None:
    """The session id (and the input's seq, when a whole number from 1) a record's bytes name
    though it may not decode: a msgpack map with a string ``session_id``; None otherwise. For
    telling what a refused record was about, never for acting on it as a record."""
    if not data or len(data) > max_bytes:
        return None
    try:
        wire = msgpack.unpackb(bytes(data), raw=False, object_pairs_hook=_Pairs)
    except Exception:  # noqa: BLE001 - msgpack raises several types for malformed input
        return None
    if not isinstance(wire, _Pairs):
        return None
    sid, seq = wire.only("session_id"), wire.only("seq")  # a key given twice names nothing (a seq
    # counted as refused that the producer never sent: the one it did send was refused as late)
    if not isinstance(sid, str) or not sid:
        return None
    return sid, seq if type(seq) is int and 1 <= seq <= MAX_SEQ else None


class _Pairs(list):
    """A msgpack map as its (key, value) pairs, in order, for :func:`names`."""

    def only(self, key: str) -> Any:
        """The value of ``key`` when the map gives it exactly once; else None."""
        values = [v for k, v in self if k == key]
        return values[0] if len(values) == 1 else None


def refused_input(data: bytes | None, key: bytes | None, max_bytes: int = DEFAULT_MAX_BYTES) -> tuple[str, int] | None:
    """The session and seq an input that does not decode (a wrong header, a bad field)
    names, when its bytes name both (:func:`names`) and it came keyed by that session: the
    seq is refused for good, so its session's owner need not wait for it. None otherwise."""
    named = names(data, max_bytes)
    if named is None or named[1] is None or key != named[0].encode():
        return None
    return named[0], named[1]


def encode(rec: Record, max_bytes: int | None = None) -> bytes:
    """The wire bytes of ``rec``: a msgpack map of its fields plus its tag and version.

    Refused (``SchemaError``) over ``max_bytes``, by default its topic's bound.
    """
    wire = {TAG: rec.TAG, VERSION: rec.VERSION, **to_fields(rec)}
    data = msgpack.packb(wire, use_bin_type=True)
    if max_bytes is None:
        max_bytes = TOPICS[topic_of(rec)].max_bytes
    if len(data) > max_bytes:
        raise SchemaError(f"encoded record is {len(data)} bytes, over the {max_bytes}-byte limit")
    return data


def key_for(rec: Record) -> bytes:
    """The Kafka key of ``rec`` on its topic."""
    return TOPICS[topic_of(rec)].key(rec).encode()


class Decoder:
    """Decodes the union of record types of one topic."""

    __slots__ = ("topic", "max_bytes", "_types")

    def __init__(self, topic: str, max_bytes: int | None = None) -> None:
        if topic not in TOPICS:
            raise KeyError(f"unknown topic {topic!r}")
        self.topic = topic
        self.max_bytes = TOPICS[topic].max_bytes if max_bytes is None else max_bytes
        self._types = {cls.TAG: cls for cls in TOPICS[topic].records}

    def decode(self, data: bytes | bytearray | memoryview | None, headers: Any = None) -> Record:
        """The record in ``data``; with ``headers``, a ``cs-t`` header that names another type
        than the record's is refused too (``SchemaError``)."""
        rec = self._decode(data)
        tags = _header_tags(headers)
        if len(tags) > 1:
            raise SchemaError(f"the {TYPE_HEADER} header is given {len(tags)} times")
        if tags and tags[0] != rec.TAG:
            raise SchemaError(f"the {TYPE_HEADER} header says {tags[0][:60]!r} but the record is {rec.TAG!r}")
        return rec

    def _decode(self, data: bytes | bytearray | memoryview | None) -> Record:
        if data is None:
            raise SchemaError("record has no value (tombstone)")
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise SchemaError(f"expected bytes, got {type(data).__name__}")
        if len(data) > self.max_bytes:
            raise SchemaError(f"payload is {len(data)} bytes, over the {self.max_bytes}-byte limit")
        try:
            wire = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, use_list=True,
                                   object_pairs_hook=_unique_keys)
        except _TwiceError as exc:
            raise SchemaError(str(exc)) from None
        except Exception as exc:  # msgpack raises several types for malformed input
            raise SchemaError(f"not msgpack: {type(exc).__name__}" + (f": {exc}" if str(exc) else "")) from None
        return self._from_wire(wire)

    def _from_wire(self, wire: Any) -> Record:
        if not isinstance(wire, dict):
            raise SchemaError(f"expected a map at the top level, got {type(wire).__name__}")
        tag = wire.pop(TAG, None)
        if not isinstance(tag, str):
            raise SchemaError("missing or non-string type tag", field=TAG)
        cls = self._types.get(tag)
        if cls is None:
            raise SchemaError(f"unknown type tag {tag[:64]!r} on topic {self.topic}", field=TAG)
        version = wire.pop(VERSION, None)
        if isinstance(version, bool) or not isinstance(version, int):
            raise SchemaError("missing or non-integer schema version", field=VERSION)
        if not 1 <= version <= cls.VERSION:
            raise SchemaError(f"unsupported version {version} of {tag} (supported 1..{cls.VERSION})",
                              field=VERSION)
        try:
            return from_fields(cls, wire)
        except SchemaError:
            raise
        except Exception as exc:  # a validator bug must still surface as the sender's SchemaError
            raise SchemaError(f"invalid record: {type(exc).__name__}: {exc}") from None


@functools.lru_cache(maxsize=256)
def decoder_for(topic: str, max_bytes: int | None = None) -> Decoder:
    """The (shared) decoder of a logical topic; ``max_bytes`` None: the topic's bound."""
    return Decoder(topic, max_bytes)


def decode(topic: str, data: bytes, max_bytes: int | None = None) -> Record:
    """Decode one record of ``topic``; raises ``SchemaError`` only."""
    return decoder_for(topic, max_bytes).decode(data)


# topics whose records' ts is a producer's event time that processors fold into windows
EVENT_TIME_TOPICS = frozenset({SESSION_EVENTS, SESSION_INPUTS})
# how far a record's ts may sit from the broker's timestamp of the record
MAX_EVENT_SKEW_S = 300.0


def bound_event_time(logical: str, rec: Record, broker_ms: int | float | None,
                     max_skew_s: float = MAX_EVENT_SKEW_S) -> tuple[Record, str | None]:
    """The record with an event time processors can trust, and why it was changed (None when
    it was not): a ``ts`` more than ``max_skew_s`` from the broker's timestamp of the record
    (milliseconds, as Kafka keeps it), ahead or behind, is replaced by that timestamp.
    Milliseconds sent as seconds, clocks far off and old events re-sent under new records
    then cannot move the processors' windows; nothing is dropped for it. Records without a
    broker timestamp pass unchanged."""
    ts = getattr(rec, "ts", None)
    if logical not in EVENT_TIME_TOPICS or ts is None or not broker_ms or broker_ms <= 0:
        return rec, None
    broker_s = broker_ms / 1000.0
    off = ts - broker_s
    if abs(off) <= max_skew_s:
        return rec, None
    unit = " (ts is Unix seconds; this looks like milliseconds)" if 500.0 < ts / broker_s < 2000.0 else ""
    gap = f"{off:+.0f}" if abs(off) < 1e12 else f"{off:+.3g}"  # a ts of 1e300 would print 300 digits
    return replace(rec, ts=broker_s), (f"event time: ts {ts!r} is {gap} s from the record's broker "
                                       f"timestamp (more than {max_skew_s:g} s): the broker's is used{unit}")
