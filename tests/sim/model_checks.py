"""What the tests of every ported workload model check alike: a trace that is seeded, valid and
round-trips through a trace file; sessions that scale with `--sessions`; a bad setting named as
one of `trace gen`."""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from infra.sim.trace import MB, parse_trace, write_trace
from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import ConfigError

OPEN, CLOSE = EventKind.OPEN, EventKind.CLOSE


def check_closed_trace(events: Sequence[SessionEvent], again: Sequence[SessionEvent], other_seed: Sequence[SessionEvent],
                       folder: Path, duration_s: float, state_mb: tuple[float, float] | None, least: int = 500) -> None:
    """The same config draws the same trace and another seed another; the trace file reads back
    as the same events, each session opens once and closes in the trace (none left for the
    reader to close), in time order, within the duration, with its state in `state_mb`."""
    events = list(events)
    assert events == list(again) != list(other_seed)
    write_trace(events, folder / "t.csv")
    with open(folder / "t.csv", newline="", encoding="utf-8") as fh:
        assert list(parse_trace(csv.reader(fh)).events) == events  # every session closes, in the trace
    opens = {e.session_id: e.t for e in events if e.kind is OPEN}
    closes = {e.session_id: e.t for e in events if e.kind is CLOSE}
    assert len(opens) == sum(e.kind is OPEN for e in events) == len(closes) > least and opens.keys() == closes.keys()
    assert all(closes[s] >= t for s, t in opens.items()) and events[-1].t <= duration_s
    assert all(a.t <= b.t for a, b in zip(events, events[1:]))
    if state_mb is not None:
        lo, hi = state_mb
        assert all(lo * MB <= e.state_bytes <= hi * MB for e in events if e.kind is OPEN)


def check_scale(sessions: Callable[[float], int], half: tuple[float, float] = (0.4, 0.65),
                double: tuple[float, float] = (1.6, 2.4)) -> None:
    """Sessions at scale 0.5 and 2 within `half` and `double` of those at scale 1."""
    n = {s: sessions(s) for s in (0.5, 1.0, 2.0)}
    assert half[0] * n[1.0] < n[0.5] < half[1] * n[1.0] and double[0] * n[1.0] < n[2.0] < double[1] * n[1.0], n


def check_bad_setting(make: Callable[..., Any], bad: dict[str, Any], families: str) -> None:
    """A bad setting is a configuration error of `trace gen`, on one line; a bad family lists the
    model's families."""
    with pytest.raises(ConfigError) as err:
        make(**bad)
    assert "trace gen" in str(err.value) and "\n" not in str(err.value)
    if "family" in bad:
        assert families in str(err.value)
