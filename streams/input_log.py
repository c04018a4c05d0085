"""One session's inputs read back from ``session-inputs``: the log holds every input until
it is applied or refused, so recovery replays from it and a close refuses from it."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.records import InputPushed
from schemas.topics import SESSION_INPUTS, misfiled

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
    is passed to the consumer's dead-letter path when ``producer`` is given. Inputs dispatch
    refuses whenever it reads them (keyed by another id, over ``max_input_bytes``) are left
    out: they were dead-lettered once and are not the session's."""
    reader = RecordConsumer(settings, [SESSION_INPUTS], producer, name=name)
    await reader.start(subscribe=False)
    try:
        part = partition_for_key(sid.encode(), len(await reader.partitions(SESSION_INPUTS)))
        begin = start[1] + 1 if start is not None and start[0] == part else -MAX_LOOKBACK
        ends = await reader.assign({SESSION_INPUTS: [part]}, begin)
        return [LoggedInput(part, d.offset, d.record) async for d in reader.read_to(ends)
                if isinstance(d.record, InputPushed) and d.record.session_id == sid and d.record.seq > after_seq
                and not _refused_at_dispatch(d.record, d.key, settings)]
    finally:
        await reader.stop()


def _refused_at_dispatch(rec: InputPushed, key: bytes | None, settings: Settings) -> bool:
    return misfiled(rec, key) is not None or len(rec.payload.encode()) > settings.max_input_bytes
