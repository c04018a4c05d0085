"""One session's inputs read back from ``session-inputs``: the log holds every input until
it is applied or refused, so recovery replays from it and a close refuses from it."""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiokafka import TopicPartition

from schemas.input_rate import RateCount, rate_counted
from schemas.records import InputPushed
from schemas.topics import SESSION_INPUTS

from .config import Settings
from .kafka import Delivered, RecordConsumer
from .topics import partition_for_key

__all__ = ["LoggedInput", "read_session_inputs", "count_partition_inputs", "MAX_LOOKBACK"]

# a read from a partition's start looks at most this many records back from its end
MAX_LOOKBACK = 100_000


@dataclass(frozen=True, slots=True)
class LoggedInput:
    """An input as the log holds it, with where it sits."""

    partition: int
    offset: int
    record: InputPushed
    # seqs of the session's inputs refused since the input before this one (the rate rule, or
    # bytes that did not decode; a replay's owner takes them for withdrawn, as dispatch's
    # ``refused_before``)
    refused_before: tuple[int, ...] = ()


async def read_session_inputs(settings: Settings, sid: str, after_seq: int,
                              start: tuple[int, int] | None = None,
                              name: str = "input-log") -> list[LoggedInput]:
    """The session's inputs with ``seq > after_seq`` up to the partition's end as of now, from
    just after ``start`` (partition, offset) when it is the session's partition, else from the
    partition's start (at most ``MAX_LOOKBACK`` records back). A record that fails to decode
    is passed over with a log line (dispatch's group consumer dead-letters it, once), and when
    its bytes name the session and a seq and it came keyed by it, that seq counts as refused
    (dispatch names it so too). Inputs dispatch
    refuses whenever it reads them are left out: keyed by another id, over
    ``max_input_bytes``, a seq below 1, or past the rate rule (``schemas.input_rate``, decided
    from the log: the count of the first window read starts at the session's inputs earlier
    in that window, read back by their timestamps); they were dead-lettered once and are not
    the session's, and each input returned names those refused since the one before it
    (``LoggedInput.refused_before``), so a replay's owner does not wait for them."""
    reader = RecordConsumer(settings, [SESSION_INPUTS], None, name=name)
    await reader.start(subscribe=False)
    try:
        part = partition_for_key(sid.encode(), len(await reader.partitions(SESSION_INPUTS)))
        begin = start[1] + 1 if start is not None and start[0] == part else -MAX_LOOKBACK
        ends = await reader.assign({SESSION_INPUTS: [part]}, begin)
        first = await reader.raw.position(next(iter(ends)))
        mine = [(d, _counted(d, sid, settings)) async for d in reader.read_to(ends) if _mine(d, sid)]
        bad = sorted((offset, seq) for topic, p, offset, who, seq in reader.passed_over  # did not decode: refused
                     if topic == SESSION_INPUTS and p == part and who == sid)
        counts = RateCount(settings.input_rate_per_s, settings.input_burst)
        if (first_counted := next((d for d, ok in mine if ok), None)) is not None:
            window = counts.window(_stamp(first_counted))
            counts.seed(sid, window, (await _window(reader, part, first, counts, window, settings, sid)).get(sid, []))
        out: list[LoggedInput] = []
        refused: list[int] = []
        for d, ok in mine:
            seq = d.record.seq  # type: ignore[attr-defined]
            while bad and bad[0][0] < d.offset:  # an undecodable one before it, in log order
                refused.append(bad.pop(0)[1])
            if not ok or not counts.passes(sid, _stamp(d), seq):
                refused.append(seq)
            elif seq > after_seq:
                out.append(LoggedInput(part, d.offset, d.record,  # type: ignore[arg-type]
                                       tuple(s for s in refused if s > after_seq)))
                refused = []
        return out
    finally:
        await reader.stop()


async def count_partition_inputs(settings: Settings, partition: int, before: int, start_s: float) -> dict[str, list[int]]:
    """Every session's inputs the rate rule counts in ``partition`` below offset ``before`` in
    the rate window that begins at ``start_s``: per session, their seqs in log order
    (dispatch, reading a partition it did not read when the window began: one read for the
    partition, not one per session)."""
    reader = RecordConsumer(settings, [SESSION_INPUTS], None, name="dispatch-rate")
    await reader.start(subscribe=False)
    try:
        counts = RateCount(settings.input_rate_per_s, settings.input_burst)
        return await _window(reader, partition, before, counts, counts.window(start_s), settings)
    finally:
        await reader.stop()


async def _window(reader: RecordConsumer, part: int, before: int, counts: RateCount, window: int,
                  settings: Settings, sid: str | None = None) -> dict[str, list[int]]:
    """The seqs of each session's counted inputs in ``window`` below offset ``before``, in log
    order (only ``sid``'s when given; the reader is assigned anew for it)."""
    since = await reader.offset_at(SESSION_INPUTS, part, counts.start_s(window))
    if since is None or since >= before:
        return {}
    tp = TopicPartition(reader.catalogue.name(SESSION_INPUTS), part)
    await reader.assign({SESSION_INPUTS: [part]}, since)
    out: dict[str, list[int]] = {}
    async for d in reader.read_to({tp: before}):
        rec = d.record
        if (isinstance(rec, InputPushed) and (sid is None or rec.session_id == sid)
                and rate_counted(rec, d.key, settings.max_input_bytes) and counts.window(_stamp(d)) == window):
            out.setdefault(rec.session_id, []).append(rec.seq)
    return out


def _mine(d: Delivered, sid: str) -> bool:
    return isinstance(d.record, InputPushed) and d.record.session_id == sid


def _counted(d: Delivered, sid: str, settings: Settings) -> bool:
    rec = d.record
    return isinstance(rec, InputPushed) and rec.session_id == sid and rate_counted(rec, d.key, settings.max_input_bytes)


def _stamp(d: Delivered) -> float:
    """The record's Kafka timestamp in seconds (a broker that keeps none: now, as dispatch does)."""
    return d.timestamp_ms / 1000.0 if d.timestamp_ms is not None and d.timestamp_ms > 0 else time.time()
