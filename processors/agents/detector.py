"""The detector agent: feeds ``session-events`` to :func:`processors.detector.step`.

It publishes a ``WorkloadSignal`` record on ``metrics`` after session events (at most one per
``min_interval_s``; a held-back one goes out at the next tick) and on a periodic tick that
rolls the window forward with :func:`~processors.detector.observe`, from start-up on (an idle
system reads active 0). Run one replica: the window must see every partition. At start it
folds ``session-events`` from their start to their ends as of now (:func:`catch_up`) before
it publishes or folds on, so a restart still counts the sessions open before it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from processors.detector import DetectorConfig, DetectorState, Signal, closes, not_ahead, observe, rebuild, step
from processors.lifecycle import SessionEvent, remember_closed, session_event
from schemas import records as r
from schemas.errors import ConfigError
from streams.config_file import env_number

__all__ = ["DetectorShell", "signal_record", "catch_up", "build_app"]

log = logging.getLogger(__name__)
CATCH_UP_BATCH = 10_000  # records folded at once while reading the log from its start


def signal_record(signal: Signal, state: DetectorState, config: DetectorConfig) -> r.WorkloadSignal:
    """The wire record of a detector signal (flips split by direction from the window)."""
    lo = (state.last_slot or 0) - config.slots + 1
    rows = [row for row in state.window if row[0] >= lo]
    return r.WorkloadSignal(ts=max(0.0, signal.now), window_s=config.window_s, active=signal.active,
                            arrivals=signal.arrivals, departures=signal.departures,
                            to_idle=sum(row[3] for row in rows), to_active=sum(row[4] for row in rows),
                            volatility=signal.volatility, level=signal.level)


def step_remembering(state: DetectorState, event: SessionEvent, config: DetectorConfig,
                     closed: dict[str, None]) -> tuple[DetectorState, Signal]:
    """A shell's step: the pure :func:`~processors.detector.step`, then the id of a session
    it closed remembered in the shell's ``closed`` (this agent's and control's window)."""
    closing = closes(state, event, closed)
    state, signal = step(state, event, config, closed)
    if closing:
        remember_closed(closed, event.session_id)
    return state, signal


@dataclass
class DetectorShell:
    """The detector state between events, and when a signal was last published."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    clock: Callable[[], float] = time.time
    min_interval_s: float = 0.25
    state: DetectorState = field(default_factory=DetectorState)
    last_published: float = -math.inf
    held: bool = False
    closed: dict[str, None] = field(default_factory=dict)  # ids closed (bounded): dispatch refuses their events

    def on_event(self, rec: r.Record) -> r.WorkloadSignal | None:
        """Fold a session event; the signal to publish now, if any."""
        event = session_event(rec)
        if event is None:
            return None
        now = self.clock()
        self.state, signal = step_remembering(self.state, not_ahead(event, now), self.config, self.closed)
        if now - self.last_published < self.min_interval_s:
            self.held = True
            return None
        self.last_published, self.held = now, False
        return signal_record(signal, self.state, self.config)

    def fold_log(self, state: DetectorState, records: Iterable[r.Record],
                 closed: dict[str, None]) -> DetectorState:
        """``state`` with ``records`` (read from the log, in its order) folded in, publishing
        nothing, the ids they close remembered in ``closed``; the caller adopts both once the
        whole log is read (a read failing halfway left the shell's memory half filled)."""
        now = self.clock()
        events = (not_ahead(e, now) for e in map(session_event, records) if e is not None)
        state, ended = rebuild(events, self.config, state, closed)
        for sid in ended:
            remember_closed(closed, sid)
        return state

    def tick(self) -> r.WorkloadSignal:
        """Roll the window to now; the signal, whether or not any event was seen."""
        now = self.clock()
        self.state, signal = observe(self.state, now, self.config)
        self.last_published, self.held = now, False
        return signal_record(signal, self.state, self.config)


def detector_settings(env: Mapping[str, str]) -> tuple[DetectorConfig, float]:
    """The detector's window and its tick from the environment (``ConfigError`` naming a bad one)."""
    base = DetectorConfig()
    names = {"window_s": "CHUNKSERVE_DETECTOR_WINDOW_S", "slot_s": "CHUNKSERVE_DETECTOR_SLOT_S"}
    given = {k: env_number(env, v, float(getattr(base, k)), positive=True) for k, v in names.items()}
    try:
        config = replace(base, **given)
    except ConfigError as exc:  # the two together: name both
        raise ConfigError(" / ".join(names.values()), str(exc).rsplit(": ", 1)[-1], "environment") from None
    return config, env_number(env, "CHUNKSERVE_DETECTOR_TICK_S", 1.0, positive=True)


Folded = dict[tuple[str, int], int]  # (topic, partition) -> the first offset not folded yet


async def catch_up(settings: Any, catalogue: Any,
                   shell: DetectorShell) -> tuple[DetectorState, dict[str, None], Folded]:
    """Fold ``session-events`` from their start to their ends as of now, without a group: a
    restarted detector's agent resumes after its committed offsets, past the opens of the
    sessions still open. Returns the state and, per partition, where the fold stopped: the
    agent passes over what lies below (folding an open and its close twice would count the
    session twice), with the closed-id memory beside the state. Reads and decodes the whole log: its time grows with the log's length."""
    from schemas.topics import SESSION_EVENTS, misfiled
    from streams.kafka import RecordConsumer

    reader = RecordConsumer(settings, [SESSION_EVENTS], None, name="detector-catch-up", catalogue=catalogue)
    await reader.start(subscribe=False)
    try:
        ends = await reader.assign({SESSION_EVENTS: None})
        state, closed, batch = shell.state, dict(shell.closed), []
        async for d in reader.read_to(ends):
            if misfiled(d.record, d.key) is None:  # one keyed otherwise: dispatch refused it
                batch.append(d.record)
            if len(batch) >= CATCH_UP_BATCH:
                state, batch = shell.fold_log(state, batch, closed), []
        return shell.fold_log(state, batch, closed), closed, {(tp.topic, tp.partition): n for tp, n in ends.items()}
    finally:
        await reader.stop()


async def _rebuild(settings: Any, catalogue: Any, shell: DetectorShell, folded: Folded,
                   caught_up: asyncio.Event) -> None:
    """:func:`catch_up` into the shell, then let the agent fold on and the tick publish."""
    try:
        shell.state, shell.closed, ends = await catch_up(settings, catalogue, shell)
        folded.update(ends)
    except Exception as exc:  # the broker away: fold from the group's offsets, as before
        log.warning("detector: reading the log from its start failed (%s); folding from the agent's offsets", exc)
    finally:
        caught_up.set()


def build_app(settings: Any) -> Any:
    """The faust app: one agent over ``session-events`` and a periodic tick; at start, the
    log read from its start (:func:`catch_up`) before either folds or publishes."""
    from schemas.topics import SESSION_EVENTS, misfiled
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.topics import TopicCatalogue

    app = make_app("detector", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    config, tick_s = detector_settings(os.environ)
    shell = DetectorShell(config)
    folded: Folded = {}
    caught_up = asyncio.Event()

    @app.task
    async def rebuild_state() -> None:
        await _rebuild(settings, catalogue, shell, folded, caught_up)

    @app.agent(publisher.topic(SESSION_EVENTS), name="detector-session-events")
    async def session_events(stream: Any) -> None:
        await caught_up.wait()
        async for event in stream.events():
            msg = event.message
            rec = await decode_event(event, SESSION_EVENTS, publisher, "detector")  # dead-letters bad bytes
            if rec is None or misfiled(rec, msg.key) is not None:  # dispatch refuses it
                continue
            if msg.offset < folded.get((msg.topic, msg.partition), 0):  # in the catch-up already
                continue
            signal = shell.on_event(rec)
            if signal is not None:
                await publisher.send(signal)

    @app.timer(tick_s)
    async def tick() -> None:
        if caught_up.is_set():  # before, the state lacks the sessions open before the start
            await publisher.send(shell.tick())

    return app
