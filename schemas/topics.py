"""The logical topics, which records each carries, and how each is keyed (DESIGN.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, get_args

from . import records as r

__all__ = ["TopicSpec", "TOPICS", "SESSION_EVENTS", "SESSION_INPUTS", "WORKER_COMMANDS",
           "WORKER_EVENTS", "SCALING_COMMANDS", "METRICS", "DEAD_LETTERS", "topic_of", "misfiled", "TOPIC_FRAMING_BYTES"]

# a topic's max.message.bytes is its record bound plus this: the broker counts a record
# batch's framing (headers, offsets, CRC) in the size it checks
TOPIC_FRAMING_BYTES = 4096

SESSION_EVENTS = "session-events"
SESSION_INPUTS = "session-inputs"
WORKER_COMMANDS = "worker-commands"
WORKER_EVENTS = "worker-events"
SCALING_COMMANDS = "scaling-commands"
METRICS = "metrics"
DEAD_LETTERS = "dead-letters"


@dataclass(frozen=True, slots=True)
class TopicSpec:
    """One logical topic: its records, the key each record is sent under, and who uses it."""

    name: str
    records: tuple[type[r.Record], ...]
    key_name: str
    key: Callable[[r.Record], str]
    writers: str
    readers: str
    summary: str
    max_bytes: int = 64 * 1024  # default bound on one encoded record (configurable per deployment)


TOPICS: dict[str, TopicSpec] = {
    spec.name: spec
    for spec in (
        TopicSpec(SESSION_EVENTS, get_args(r.SessionEventRecord),
                  "session id", lambda x: x.session_id,  # type: ignore[attr-defined]
                  "producers (front end)", "detector, dispatch, control, metrics", "Session lifecycle events."),
        TopicSpec(SESSION_INPUTS, (r.InputRecord,), "session id", lambda x: x.session_id,  # type: ignore[attr-defined]
                  "producers", "dispatch (input router)", "User inputs with per-session seq.",
                  max_bytes=128 * 1024),
        TopicSpec(WORKER_COMMANDS, get_args(r.WorkerCommand),
                  "worker id", lambda x: x.worker_id,  # type: ignore[attr-defined]
                  "dispatch, control", "workers", "Commands stamped with a generation.",
                  max_bytes=128 * 1024),
        TopicSpec(WORKER_EVENTS, get_args(r.WorkerEvent),
                  "worker id", lambda x: x.worker_id,  # type: ignore[attr-defined]
                  "workers, provisioner, control", "dispatch, control, metrics",
                  "What workers did.", max_bytes=192 * 1024),
        TopicSpec(SCALING_COMMANDS, get_args(r.ScalingCommand), "pool",
                  lambda x: x.pool,  # type: ignore[attr-defined]
                  "control", "provisioner, dispatch (admission plans)",
                  "Pool size changes; where sessions go next.", max_bytes=64 * 1024),
        TopicSpec(METRICS, get_args(r.MetricRecord),
                  "t", lambda x: x.TAG,
                  "detector, control, metrics", "any subscriber (the metrics processor, watch)",
                  "Signals, reports and costs.", max_bytes=1024 * 1024),
        TopicSpec(DEAD_LETTERS, (r.DeadLetter,), "source topic",
                  lambda x: x.source_topic,  # type: ignore[attr-defined]
                  "every consumer", "operators", "Records a consumer could not take.",
                  max_bytes=1024 * 1024),
    )
}

_BY_TYPE = {cls: spec.name for spec in TOPICS.values() for cls in spec.records}


def topic_of(record: r.Record) -> str:
    """The logical topic a record belongs on."""
    return _BY_TYPE[type(record)]


def misfiled(record: r.Record, key: bytes | None) -> str | None:
    """Why a session's record is refused for its key, or None: the contract keys session
    events and inputs by the session id, so that all of a session's records share a partition
    and keep their order; one keyed otherwise could overtake or trail the others. Dispatch
    dead-letters such a record; every other reader passes over it (the detector, control's
    fold, metrics, replays), so nothing counts what dispatch refused."""
    if _BY_TYPE[type(record)] not in (SESSION_EVENTS, SESSION_INPUTS):
        return None
    sid = record.session_id  # type: ignore[attr-defined]
    if key == sid.encode():
        return None
    said = "no key" if key is None else f"key {key.decode('utf-8', 'backslashreplace')!r}"
    return f"{said}: not the session id {sid!r} (a session's records must be keyed by it to stay in order)"
