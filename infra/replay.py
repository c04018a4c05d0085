"""``chunkserve replay``: rebuild a processor's state from the topics (the log is the truth).

Reads the topics the processor folds, from the beginning or from an offset, through the same
pure folds the live processors run (``processors.cluster.apply`` for dispatch/control,
``processors.detector.step`` for the detector), and returns the rebuilt state as plain data.
"""

from __future__ import annotations

import dataclasses
import heapq
import os
from typing import Any, Iterable, Mapping

from processors.cluster import ClusterView, apply
from processors.lifecycle import SessionState
from schemas.errors import ConfigError
from schemas.codec import names
from schemas.records import ChunkDone, DeadLetter, Handoff, InputAccepted, Record, WorkerDown
from schemas.topics import DEAD_LETTERS, SCALING_COMMANDS, SESSION_EVENTS, WORKER_COMMANDS, WORKER_EVENTS, misfiled
from streams.config import Settings
from streams.kafka import Delivered, RecordConsumer

__all__ = ["Log", "read_log", "in_time_order", "story_entries", "cluster_summary", "cluster_view", "detector_signal", "replay", "session_story", "session_log"]

CLUSTER_TOPICS = (SESSION_EVENTS, WORKER_EVENTS, SCALING_COMMANDS, WORKER_COMMANDS)
STORY_TOPICS = (SESSION_EVENTS, WORKER_EVENTS, WORKER_COMMANDS, DEAD_LETTERS)


@dataclasses.dataclass(frozen=True, slots=True)
class Log:
    """A read of the topics, in time order: the records the fleet acts on; those it refused
    for their signature (where this process holds the keys, as the fleet does: a command
    unsigned or forged, a worker event its worker did not sign or that speaks for another),
    each with why (``streams.signing``'s code); how many records did not decode; and where
    each record read sits (by ``id``: topic, partition, offset)."""

    records: list[Record]
    refused: list[tuple[Record, str]]
    undecodable: int
    places: Mapping[int, tuple[str, int, int]] = dataclasses.field(default_factory=dict)


async def read_log(settings: Settings, topics: tuple[str, ...], offset: int = 0) -> Log:
    """Every decodable record of ``topics`` from ``offset`` (per partition) up to the end each
    partition had when the read began. Read-only: it publishes nothing (the topics' own
    consumers dead-letter bad records, once)."""
    consumer = RecordConsumer(settings, list(topics), None, name="replay")
    await consumer.start(subscribe=False)
    try:
        ends = await consumer.assign(dict.fromkeys(topics), max(0, offset), deployed=True)
        if offset > 0 and all(offset >= end for end in ends.values()):  # it read as an empty cluster, exit 0
            raise ConfigError("--offset", f"{offset} is past the end of every partition of {', '.join(topics)} "
                              f"(the longest holds {max(ends.values(), default=0)} records): nothing to read",
                              "command line")
        # a session's record keyed otherwise was refused by dispatch: no processor folds it
        read = in_time_order([d async for d in consumer.read_to(ends) if misfiled(d.record, d.key) is None])
        return Log([d.record for d in read if d.refused is None],
                   [(d.record, d.refused) for d in read if d.refused is not None], consumer.dead_lettered,
                   {id(d.record): (d.topic, d.partition, d.offset) for d in read})
    finally:
        await consumer.stop()


def in_time_order(read: Iterable[Delivered]) -> list[Delivered]:
    """The partitions' records merged by their Kafka timestamps, each partition's kept in its
    own order: the same list however the fetches interleaved them. Folded in fetch order, two
    runs of ``replay control --offset 1`` on one log disagreed (an idle before or after the
    owner's claim that made its session known: ``suspended`` or ``unseen``)."""
    parts: dict[tuple[str, int], list[Delivered]] = {}
    for d in read:
        parts.setdefault((d.topic, d.partition), []).append(d)
    ordered = [sorted(ds, key=lambda d: d.offset) for _, ds in sorted(parts.items())]
    return list(heapq.merge(*ordered, key=_stamp_ms))


def _stamp_ms(d: Delivered) -> float:
    return d.timestamp_ms if d.timestamp_ms is not None else d.record.ts * 1000


def cluster_summary(view: ClusterView) -> dict[str, Any]:
    """The rebuilt view as plain data: sessions (state, owner, epoch) and workers."""
    sessions = {  # "unseen": known from owner records only (its session events lie before the offset)
        sid: {"state": s.lifecycle.value if s.lifecycle is not None else "unseen",
              "owner": s.placed_on, "epoch": s.owner[0]}
        for sid, s in sorted(view.sessions.items())
    }
    # a worker heard from after it was declared dead counts again (a heartbeat after the
    # WorkerDown: it was shown down), and a session that ended is no worker's any more
    workers = {
        wid: {"capacity": w.up[1], "down": not w.alive,
              "sessions": sum(1 for s in view.sessions.values()
                              if s.placed_on == wid and s.lifecycle != SessionState.TERMINATED)}
        for wid, w in sorted(view.workers.items())
    }
    states: dict[str, int] = {}
    for s in sessions.values():
        states[s["state"]] = states.get(s["state"], 0) + 1
    return {"sessions": sessions, "workers": workers, "session_states": states}


def cluster_view(records: list[Record]) -> ClusterView:
    """The view control and dispatch fold from these records (commands other than
    ``Handoff`` are not theirs to fold)."""
    view = ClusterView()
    for rec in records:
        if not rec.TAG.startswith("cmd.") or isinstance(rec, Handoff):
            view = apply(view, rec)
    return view


def detector_signal(records: list[Record], config: Any = None) -> dict[str, Any] | None:
    """The detector's signal over these session events at the latest event's time, folded
    in the log's order as the live detector folds them (:func:`~processors.detector.rebuild`,
    the state ``step`` reaches, in O(events)), under ``config`` (the live detector's window,
    from the environment, when None). Sorted by time instead, a close stamped before its
    open by a skewed producer left the session open here while every processor had closed
    it. Partitions read in another interleaving give the same signal."""
    from processors.agents.detector import detector_settings
    from processors.detector import observe, rebuild
    from processors.lifecycle import session_event

    config = config if config is not None else detector_settings(os.environ)[0]
    events = [e for e in map(session_event, records) if e is not None]
    if not events:
        return None
    _, signal = observe(rebuild(events, config)[0], max(e.t for e in events), config)
    return dataclasses.asdict(signal)


async def replay(settings: Settings, processor: str = "control", offset: int = 0) -> dict[str, Any]:
    """Rebuild ``processor``'s state (dispatch and control share the cluster view)."""
    if processor in ("control", "dispatch", "cluster"):
        log = await read_log(settings, CLUSTER_TOPICS, offset)
        return {**_counts(processor, log), **cluster_summary(cluster_view(log.records))}
    if processor == "detector":
        log = await read_log(settings, (SESSION_EVENTS,), offset)
        return {**_counts(processor, log), "signal": detector_signal(log.records)}
    raise ValueError(f"unknown processor {processor!r}: choose control, dispatch or detector")


def _counts(processor: str, log: Log) -> dict[str, Any]:
    """What a replay read: records folded (the refused ones are not: no processor folds them),
    refused by signature, undecodable."""
    return {"processor": processor, "records": len(log.records), "refused": len(log.refused),
            "undecodable": log.undecodable}


def story_entries(records: list[Record], sid: str, t0: float, refused: Mapping[int, str] | None = None,
                  places: Mapping[int, tuple[str, int, int]] | None = None) -> tuple[list[dict[str, Any]], float | None]:
    """What the log says happened to one session, as data: each event, command, claim, freeze,
    release, refusal and dead letter (``t`` seconds after ``t0``, ``who``: the generation's
    ``worker#epoch``, a worker or ``-``, ``what``: the record's type tag, ``detail``: its reason
    or target; with ``places``, ``topic``, ``partition`` and ``offset``: where it sits, the
    order a reader of that partition meets it in, which its ``t`` may not say), and when its
    last chunk was released (None: no chunk). ``refused`` holds the records the fleet refused
    for their signature (by ``id``, with why): told with ``detail`` ``refused: WHY``, and none
    of them makes an owner or a chunk."""
    told: list[dict[str, Any]] = []
    refused, places = refused or {}, places or {}
    chunk_at, owners = None, _owners([rec for rec in records if id(rec) not in refused], sid)

    def tell(rec: Record, who: str, what: str, detail: str) -> None:
        at = places.get(id(rec))
        told.append({"t": round(getattr(rec, "ts", t0) - t0, 3), "who": who, "what": what, "detail": detail,
                     **({"topic": at[0], "partition": at[1], "offset": at[2]} if at is not None else {})})

    for rec in records:
        if isinstance(rec, DeadLetter):
            if _letter_of(rec, sid):
                tell(rec, "-", "DeadLetter", rec.reason)
            continue
        why = refused.get(id(rec))
        if isinstance(rec, WorkerDown) and rec.worker_id in owners:  # its owner (or a past one) declared dead
            tell(rec, rec.worker_id, rec.TAG, rec.reason if why is None else f"refused: {why}")
            continue
        if getattr(rec, "session_id", None) != sid or (isinstance(rec, InputAccepted) and why is None):
            continue
        if isinstance(rec, ChunkDone) and why is None:
            chunk_at = rec.ts
            continue
        gen = getattr(rec, "generation", None)
        who = f"{gen.worker_id}#{gen.epoch}" if gen is not None else getattr(rec, "worker_id", "-")
        detail = getattr(rec, "reason", "") or getattr(rec, "target_worker", "")
        tell(rec, who, rec.TAG, detail if why is None else f"refused: {why}")
    return told, None if chunk_at is None else round(chunk_at - t0, 3)


def session_story(records: list[Record], sid: str, t0: float, last: int = 12,
                  refused: Mapping[int, str] | None = None) -> list[str]:
    """:func:`story_entries` as text (``+t worker#epoch Tag reason``; a dead letter's reason
    cut at 80 characters), the last ``last`` of them (after a line saying how many earlier ones
    were left out), then when its last chunk was released."""
    entries, chunk_at = story_entries(records, sid, t0, refused)
    told = [f"+{e['t']:.1f} {e['who'] + ' ' if e['what'] != 'DeadLetter' else ''}{e['what']} "
            f"{e['detail'][:80] if e['what'] == 'DeadLetter' else e['detail']}".rstrip() for e in entries]
    n = len(told) - last
    cut = [f"({n} earlier {'entry' if n == 1 else 'entries'} left out; --last {len(told)} shows them all)"] if n > 0 else []
    return [*cut, *told[-last:], "no chunk" if chunk_at is None else f"last chunk +{chunk_at:.1f}"]


def _owners(records: list[Record], sid: str) -> set[str]:
    """The workers that held a generation of session ``sid`` in these records."""
    return {g.worker_id for rec in records if getattr(rec, "session_id", None) == sid
            and (g := getattr(rec, "generation", None)) is not None}


def _about(rec: Record, sid: str) -> bool:
    return getattr(rec, "session_id", None) == sid or (isinstance(rec, DeadLetter) and _letter_of(rec, sid))


def _letter_of(letter: DeadLetter, sid: str) -> bool:
    """Whether a dead letter is of session ``sid``: keyed by it, or a record naming it that
    came keyed otherwise (or with no key: refused for that)."""
    if letter.key == sid.encode():
        return True
    named = names(letter.raw)  # None: not msgpack, or cut short
    return named is not None and named[0] == sid


async def session_log(settings: Settings, sid: str, last: int = 50) -> dict[str, Any]:
    """One session's story from the topics (its events, the commands and worker reports of
    it, its dead letters, and what the fleet refused of them for their signature), in time
    order, with its chunk and accepted-input counts. Reads every record of those topics: its
    time grows with the log."""
    log = await read_log(settings, STORY_TOPICS)
    mine = [r for r in log.records if _about(r, sid)]
    owners, span = _owners(mine, sid), [getattr(r, "ts", 0.0) for r in mine] or [0.0]

    def death(rec: Record) -> bool:  # an owner declared dead while the session lived
        return isinstance(rec, WorkerDown) and rec.worker_id in owners and min(span) <= rec.ts <= max(span)

    refused = {id(r): why for r, why in log.refused if _about(r, sid) or death(r)}
    taken = [*mine, *filter(death, log.records)]
    told = sorted([*taken, *(r for r, _ in log.refused if id(r) in refused)], key=lambda r: getattr(r, "ts", 0.0))
    # the story's clock starts at what the fleet took (a refused record's time may be made up)
    t0 = min((getattr(r, "ts", 0.0) for r in taken), default=getattr(told[0], "ts", 0.0) if told else 0.0)
    return {"session": sid, "records": len(taken), "refused": len(refused), "undecodable": log.undecodable,
            "from_ts": t0, "chunks": len({r.chunk_index for r in mine if isinstance(r, ChunkDone)}),  # a redelivery counted once
            "inputs_accepted": len({r.seq for r in mine if isinstance(r, InputAccepted)}),
            "story": session_story(told, sid, t0, last, refused) if told else [],
            # the same as data: the last `last` entries, how many earlier ones were left out
            **_entries(told, sid, t0, last, refused, log.places)}


def _entries(told: list[Record], sid: str, t0: float, last: int, refused: Mapping[int, str],
             places: Mapping[int, tuple[str, int, int]]) -> dict[str, Any]:
    entries, chunk_at = story_entries(told, sid, t0, refused, places) if told else ([], None)
    return {"entries": entries[-last:], "left_out": max(0, len(entries) - last), "last_chunk_t": chunk_at}
