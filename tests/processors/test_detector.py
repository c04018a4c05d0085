import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.detector import (DetectorConfig, DetectorState, closes, observe, rebuild, signals, step, variation,
                                 volatility_level)
from processors.lifecycle import EventKind, SessionEvent, remember_closed
from schemas.errors import ConfigError


@st.composite
def traces(draw):
    """Valid event sequences: opens for new ids, flips and closes for known ones."""
    t, events, active, idle, n = 0.0, [], set(), set(), 0
    for _ in range(draw(st.integers(1, 80))):
        t += draw(st.sampled_from([0.0, 0.3, 1.0, 2.5, 7.0, 20.0]))
        choices = ["open"] + (["idle", "close"] if active else []) + (["active", "close"] if idle else [])
        kind = draw(st.sampled_from(choices))
        if kind == "open":
            sid, n = f"s{n}", n + 1
            active.add(sid)
        elif kind == "idle":
            sid = draw(st.sampled_from(sorted(active)))
            active.remove(sid), idle.add(sid)
        elif kind == "active":
            sid = draw(st.sampled_from(sorted(idle)))
            idle.remove(sid), active.add(sid)
        else:
            sid = draw(st.sampled_from(sorted(active | idle)))
            active.discard(sid), idle.discard(sid)
        events.append(SessionEvent(t, sid, EventKind(kind)))
    return events, len(active), len(idle)


@settings(max_examples=150, deadline=None)
@given(traces(), st.sampled_from([(60.0, 5.0), (10.0, 1.0), (30.0, 30.0)]))
def test_volatility_equals_direct_computation(trace, window):
    events, n_active, n_idle = trace
    config = DetectorConfig(window_s=window[0], slot_s=window[1])
    state, signal = DetectorState(), None
    for ev in events:
        state, signal = step(state, ev, config)
    slot = lambda t: math.floor(t / config.slot_s)  # noqa: E731
    cur, first = slot(events[-1].t), slot(events[0].t)
    lo = max(first, cur - config.slots + 1)
    counts = [sum(1 for e in events if slot(e.t) == k and e.kind in (EventKind.OPEN, EventKind.ACTIVE)) for k in range(lo, cur + 1)]
    expected = float(np.std(counts)) if len(counts) > 1 else 0.0
    assert signal.volatility == pytest.approx(expected, abs=1e-9)
    cv = float(np.std(counts) / np.mean(counts)) if len(counts) > 1 and np.mean(counts) > 0 else 0.0
    assert signal.variation == pytest.approx(cv, abs=1e-9) == pytest.approx(variation(counts), abs=1e-9)
    assert signal.level == volatility_level(signal.variation, config.thresholds)
    assert (signal.active, signal.idle) == (n_active, n_idle)
    assert signal.arrivals == sum(1 for e in events if slot(e.t) >= lo and e.kind is EventKind.OPEN)


def test_levels_and_window_roll():
    config = DetectorConfig(slot_s=5.0)
    assert volatility_level(0.0, config.thresholds) == 1
    assert volatility_level(100.0, config.thresholds) == 10
    state, sig = DetectorState(), None
    for i in range(20):
        state, sig = step(state, SessionEvent(0.0, f"s{i}", EventKind.OPEN), config)
    state, sig = observe(state, 5.0, config)
    assert sig.volatility == pytest.approx(10.0) and sig.arrivals == 20
    state, sig = observe(state, 1000.0, config)
    assert sig.volatility == 0.0 and sig.arrivals == 0 and sig.active == 20
    dup, sig2 = step(state, SessionEvent(1000.0, "s0", EventKind.OPEN), config)
    assert sig2.active == 20 and sig2.arrivals == 0



# any events at all: ids reused, flips of unknown ids, times out of order
anything = st.lists(st.builds(SessionEvent, st.floats(0, 400, allow_nan=False), st.sampled_from("abcdefg"),
                              st.sampled_from(list(EventKind))), max_size=120)


def stepping(events, config, state=DetectorState(), closed=None):
    """What a live detector does with each event: ``step`` (pure), then remember the id it
    ``closes``; the state, the last signal and the closed ids."""
    closed, signal = dict(closed or {}), None
    for event in events:
        closing = closes(state, event, closed)
        state, signal = step(state, event, config, closed)
        if closing:
            remember_closed(closed, event.session_id)
    return state, signal, closed


@settings(max_examples=300, deadline=None)
@given(anything, st.integers(0, 120), st.sampled_from([(60.0, 5.0), (10.0, 1.0), (3.0, 3.0)]))
def test_rebuild_ends_where_stepping_each_event_ends(events, cut, window):
    """A restarted detector folds its log with ``rebuild``: the state must be the one the
    live detector reached stepping through the same events, from any state on, and the ids
    it names closed the ones stepping remembered."""
    config = DetectorConfig(window_s=window[0], slot_s=window[1])
    stepped, _, closed = stepping(events, config)
    rebuilt, ended = rebuild(events, config)
    assert rebuilt == stepped and dict.fromkeys(ended) == closed
    head, _, head_closed = stepping(events[:cut], config)
    before = dict(head_closed)
    tail, tail_ended = rebuild(events[cut:], config, head, head_closed)
    assert tail == stepped and {**head_closed, **dict.fromkeys(tail_ended)} == closed
    assert head_closed == before  # read only: the caller remembers what it returns
    state, event = stepped, (events or [SessionEvent(0, "x", EventKind.OPEN)])[-1]
    assert step(state, event, config, closed) == step(state, event, config, closed)  # pure: same in, same out


# any events, times out of order within a few ticks of each other
nearby = st.lists(st.builds(SessionEvent, st.floats(0, 40, allow_nan=False), st.sampled_from("abcdefg"),
                            st.sampled_from(list(EventKind))), max_size=60)


@settings(max_examples=400, deadline=None)
@given(st.one_of(anything, nearby), st.sampled_from([0.7, 5.0, 30.0]), st.sampled_from([(60.0, 5.0), (10.0, 1.0), (3.0, 3.0)]))
def test_signals_of_a_whole_trace_are_those_of_step_and_observe(events, tick, window):
    """The simulator reads a trace's signals from ``signals`` (one pass with mutable sets):
    each must be the one ``step`` gives for its event, with ``observe`` on every tick before
    a later event, the state carried from call to call; times out of order, ids reused and
    flips of unknown ids included."""
    config = DetectorConfig(window_s=window[0], slot_s=window[1])
    state, want, at = DetectorState(), [], tick
    for event in events:
        while at < event.t:
            state, sig = observe(state, at, config)
            want.append((at, sig))
            at += tick
        state, sig = step(state, event, config)
        want.append((event.t, sig))
    times, sigs = signals(events, tick, config)
    assert list(zip(times, sigs)) == want
    with pytest.raises(ConfigError, match="tick_s"):  # a tick of 0 would never reach the next event
        signals(events, 0.0, config)


def test_a_traces_first_instant_given_as_its_start_is_state_not_a_burst():
    """A trace cut mid-stream opens every session alive at its first instant. Given as
    ``start``, those events are the state the window starts from: the readings after it are
    those of the flow alone (the sessions counted as active and idle), where read as
    arrivals they fill one slot and the level reads a burst for a whole window."""
    config = DetectorConfig()  # 60 s of 1 s slots
    head = [SessionEvent(0.0, f"w{i}", EventKind.OPEN) for i in range(200)]
    head += [SessionEvent(0.0, f"w{i}", EventKind.IDLE) for i in range(0, 200, 4)]
    flow = [SessionEvent(0.5 + t, f"n{t}", EventKind.OPEN) for t in range(50)]  # one a second
    times, sigs = signals(head + flow, 5.0, config, start=0.0)
    alone_times, alone = signals(flow, 5.0, config)
    assert times[0] == 0.0 and (sigs[0].active, sigs[0].idle, sigs[0].arrivals) == (150, 50, 0)
    assert times[1:] == alone_times
    for sig, want in zip(sigs[1:], alone):
        assert (sig.level, sig.variation, sig.arrivals) == (want.level, want.variation, want.arrivals)
        assert (sig.active, sig.idle) == (want.active + 150, 50)
    _, burst = signals(head + flow, 5.0, config)  # the same events read as arrivals
    assert burst[-1].level == 10 and sigs[-1].level < 5
    assert signals(head, 5.0, config, start=0.0) == ((0.0,), (sigs[0],))  # nothing after it


def test_a_closed_session_opened_again_is_not_counted():
    """A session id is not used again: dispatch refuses an open of a closed one, and the
    detector passes over it (it counted an arrival and an active session for good, in the
    live detector and in `replay detector` alike; found by an outside run)."""
    config = DetectorConfig()
    events = [SessionEvent(0, "a", EventKind.OPEN), SessionEvent(5, "a", EventKind.CLOSE),
              SessionEvent(6, "a", EventKind.OPEN), SessionEvent(7, "a", EventKind.IDLE), SessionEvent(8, "a", EventKind.ACTIVE)]
    state, signal, closed = stepping(events, config)
    assert signal.active == 0 and signal.arrivals == 1 and closed == {"a": None}
    assert rebuild(events, config) == (state, ("a",))
    from processors.agents.detector import DetectorShell
    from schemas import records as r

    shell = DetectorShell(config, clock=lambda: 10.0)
    for rec in (r.SessionOpened(session_id="b", ts=1.0), r.SessionClosed(session_id="b", ts=2.0),
                r.SessionOpened(session_id="b", ts=3.0)):
        shell.on_event(rec)
    assert shell.state.active == frozenset() and "b" in shell.closed
    from processors.agents.control import ControlShell
    from processors.agents.control_config import ControlConfig

    control = ControlShell(ControlConfig(), clock=lambda: 10.0)  # its own window feeds the policy's level
    for rec in (r.SessionOpened(session_id="c", ts=1.0), r.SessionClosed(session_id="c", ts=2.0),
                r.SessionOpened(session_id="c", ts=3.0)):
        control.fold(rec)
    assert control.detector.active == frozenset() and "c" in control.closed


def test_replay_detector_gives_the_signal_step_by_step_gives():
    """`chunkserve replay detector` folds the log with ``rebuild``; its signal is the one
    folding the same records in the log's order with ``step`` reaches, read at the latest
    event's time (the live detector folds in the log's order: sorted by time, a close stamped
    before its open left the session open), and the same for any interleaving of sessions."""
    import dataclasses
    import random

    from infra.replay import detector_signal
    from processors.lifecycle import session_event
    from schemas import records as rr

    kinds = [rr.SessionOpened, rr.SessionActive, rr.SessionIdle, rr.SessionClosed]
    for seed in range(60):
        rng = random.Random(seed)
        recs = [k(session_id=f"s{rng.randint(0, 30)}", ts=round(rng.uniform(0, 400), 1))
                for k in (rng.choice(kinds) for _ in range(rng.randint(0, 200)))]
        config = DetectorConfig()
        state, signal, _ = stepping([session_event(rec) for rec in recs], config)
        if recs:
            _, signal = observe(state, max(x.ts for x in recs), config)
        assert detector_signal(recs) == (None if signal is None else dataclasses.asdict(signal)), seed
        by_session = sorted(recs, key=lambda x: x.session_id)  # another interleaving, each session's order kept
        assert detector_signal(by_session) == detector_signal(recs), seed
    skewed = [rr.SessionOpened(session_id="a", ts=100.0), rr.SessionClosed(session_id="a", ts=2.0)]
    assert detector_signal(skewed)["active"] == 0


def test_replay_detector_reads_the_window_the_live_detector_reads(monkeypatch):
    """The replay folded with the default window whatever CHUNKSERVE_DETECTOR_WINDOW_S said."""
    import dataclasses

    from infra.replay import detector_signal
    from processors.lifecycle import session_event
    from schemas import records as rr

    recs = [rr.SessionOpened(session_id=f"s{i}", ts=float(i)) for i in range(40)]
    monkeypatch.setenv("CHUNKSERVE_DETECTOR_WINDOW_S", "5")
    monkeypatch.setenv("CHUNKSERVE_DETECTOR_SLOT_S", "0.5")
    config = DetectorConfig(window_s=5.0, slot_s=0.5)
    state, signal = DetectorState(), None
    for rec in recs:
        state, signal = step(state, session_event(rec), config)
    assert detector_signal(recs) == dataclasses.asdict(signal) != detector_signal(recs, DetectorConfig())
