"""A session event stamped ahead of the reading process's clock (the broker lets a
producer's time through within minutes) counts at that clock, so it cannot move the
detector's window past every honest event."""

from __future__ import annotations

from processors.agents.detector import DetectorShell
from processors.detector import FUTURE_S, not_ahead
from processors.lifecycle import EventKind, SessionEvent
from schemas import records as r


def test_an_event_ahead_of_the_clock_counts_at_the_clock():
    ev = SessionEvent(1000.0, "s", EventKind.OPEN, 7)
    assert not_ahead(ev, 1000.0) is ev
    moved = not_ahead(ev, 500.0)
    assert (moved.t, moved.session_id, moved.kind, moved.state_bytes) == (500.0 + FUTURE_S, "s", EventKind.OPEN, 7)


def test_one_future_event_does_not_blind_the_detector_to_the_honest_ones():
    now = [1000.0]
    shell = DetectorShell(clock=lambda: now[0], min_interval_s=0.0)
    shell.on_event(r.SessionActive(session_id="liar", ts=1299.0))  # 299 s ahead
    signal = None
    for i in range(20):
        now[0] = 1001.0 + i
        signal = shell.on_event(r.SessionOpened(session_id=f"s{i}", ts=now[0]))
    assert signal is not None and signal.arrivals == 21  # the honest opens count (the liar too, now)
