"""The detector agent: feeds ``session-events`` to :func:`processors.detector.step`.

It publishes a ``WorkloadSignal`` record on ``metrics`` after session events (at most one per
``min_interval_s``; a held-back one goes out at the next tick) and on a periodic tick that
rolls the window forward with :func:`~processors.detector.observe`. Run one replica: the
window must see every partition.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from processors.detector import DetectorConfig, DetectorState, Signal, not_ahead, observe, step
from processors.lifecycle import session_event
from schemas import records as r
from schemas.errors import ConfigError
from streams.config_file import env_number

__all__ = ["DetectorShell", "signal_record", "build_app"]



def signal_record(signal: Signal, state: DetectorState, config: DetectorConfig) -> r.WorkloadSignal:
    """The wire record of a detector signal (flips split by direction from the window)."""
    lo = (state.last_slot or 0) - config.slots + 1
    rows = [row for row in state.window if row[0] >= lo]
    return r.WorkloadSignal(ts=max(0.0, signal.now), window_s=config.window_s, active=signal.active,
                            arrivals=signal.arrivals, departures=signal.departures,
                            to_idle=sum(row[3] for row in rows), to_active=sum(row[4] for row in rows),
                            volatility=signal.volatility, level=signal.level)


@dataclass
class DetectorShell:
    """The detector state between events, and when a signal was last published."""

    config: DetectorConfig = field(default_factory=DetectorConfig)
    clock: Callable[[], float] = time.time
    min_interval_s: float = 0.25
    state: DetectorState = field(default_factory=DetectorState)
    last_published: float = -math.inf
    held: bool = False

    def on_event(self, rec: r.Record) -> r.WorkloadSignal | None:
        """Fold a session event; the signal to publish now, if any."""
        event = session_event(rec)
        if event is None:
            return None
        now = self.clock()
        self.state, signal = step(self.state, not_ahead(event, now), self.config)
        if now - self.last_published < self.min_interval_s:
            self.held = True
            return None
        self.last_published, self.held = now, False
        return signal_record(signal, self.state, self.config)

    def tick(self) -> r.WorkloadSignal | None:
        """Roll the window to now; the signal, once any event was seen."""
        if self.state.last_slot is None:
            return None
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


def build_app(settings: Any) -> Any:
    """The faust app: one agent over ``session-events`` and a periodic tick."""
    from schemas.topics import SESSION_EVENTS, misfiled
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.topics import TopicCatalogue

    app = make_app("detector", settings)
    publisher = FaustPublisher(app, TopicCatalogue.from_settings(settings))
    config, tick_s = detector_settings(os.environ)
    shell = DetectorShell(config)

    @app.agent(publisher.topic(SESSION_EVENTS), name="detector-session-events")
    async def session_events(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, SESSION_EVENTS, publisher, "detector")
            if rec is None or misfiled(rec, event.message.key) is not None:  # dispatch refuses it
                continue
            signal = shell.on_event(rec)
            if signal is not None:
                await publisher.send(signal)

    @app.timer(tick_s)
    async def tick() -> None:
        signal = shell.tick()
        if signal is not None:
            await publisher.send(signal)

    return app
