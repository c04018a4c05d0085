"""One session's inputs read back from ``session-inputs``: the log holds every input until
it is applied or refused, so recovery replays from it and a close refuses from it."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.records import InputPushed
from schemas.topics import SESSION_INPUTS

from .config import Settings
from .kafka import RecordConsumer, RecordProducer
from .topics import partition_for_key

__all__ = ["LoggedInput", "read_session_inputs", "MAX_LOOKBACK"]

# a read from a partition's start looks at most this many records back from its end
MAX_LOOKBACK = 100_000


@dataclass(frozen=True, slots=True)
class LoggedInput:
    """An input as the log holds it, with where it sits."""

    partition: int
    offset: int
    record: InputPushed


async def read_session_inputs(settings: Settings, sid: str, after_seq: int,
                              start: tuple[int, int] | None = None,
                              producer: RecordProducer | None = None,
                              name: str = "input-log") -> list[LoggedInput]:
    """The session's inputs with ``seq > after_seq`` up to the partition's end as of now, from
    just after ``start`` (partition, offset) when it is the session's partition, else from the
    partition's start (at most ``MAX_LOOKBACK`` records back). A record that fails to decode
    is passed to the consumer's dead-letter path when ``producer`` is given."""
    from aiokafka import TopicPartition

    reader = RecordConsumer(settings, [SESSION_INPUTS], producer, name=name)
    await reader.start(subscribe=False)
    try:
        partitions = await reader.partitions(SESSION_INPUTS)
        part = partition_for_key(sid.encode(), len(partitions))
        tp = TopicPartition(reader.catalogue.name(SESSION_INPUTS), part)
        reader.raw.assign([tp])
        end = (await reader.raw.end_offsets([tp]))[tp]
        first = (await reader.raw.beginning_offsets([tp]))[tp]
        begin = start[1] + 1 if start is not None and start[0] == part else max(first, end - MAX_LOOKBACK)
        reader.raw.seek(tp, max(begin, first))
        out: list[LoggedInput] = []
        while await reader.raw.position(tp) < end:
            for d in await reader.poll(timeout_ms=200):
                rec = d.record
                if (isinstance(rec, InputPushed) and rec.session_id == sid and rec.seq > after_seq
                        and d.offset < end):
                    out.append(LoggedInput(part, d.offset, rec))
        return out
    finally:
        await reader.stop()
