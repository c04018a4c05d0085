"""Event time that cannot be poisoned: a producer's ts far from the broker's timestamp of
the record is replaced by the broker's (seconds, milliseconds, the future, the past)."""

from __future__ import annotations

import pytest

from schemas.codec import MAX_EVENT_SKEW_S, bound_event_time
from schemas.records import ChunkDone, Generation, InputPushed, SessionOpened

NOW_MS = 1_796_000_000_000  # the broker's timestamp of the record, milliseconds
NOW = NOW_MS / 1000.0


@pytest.mark.parametrize("ts, kept", [
    (NOW, True),
    (NOW - MAX_EVENT_SKEW_S + 1, True),  # a producer a little behind
    (NOW + 60, True),  # or a little ahead
    (NOW_MS, False),  # milliseconds sent as seconds
    (NOW + 86_400, False),  # a day in the future
    (NOW - 30 * 86_400, False),  # an old event re-sent
    (1.0, False),  # not a Unix time at all
])
def test_a_ts_far_from_the_broker_timestamp_is_replaced(ts: float, kept: bool) -> None:
    rec = SessionOpened(session_id="s", ts=ts, prompt="p")
    got, why = bound_event_time("session-events", rec, NOW_MS)
    if kept:
        assert got is rec and why is None
    else:
        assert got.ts == NOW and got.session_id == "s" and why is not None and "broker" in why
        assert ("milliseconds" in why) == (ts == NOW_MS)


def test_only_producer_event_times_and_only_with_a_broker_timestamp() -> None:
    chunk = ChunkDone(worker_id="w", session_id="s", generation=Generation("w", 1), chunk_index=0, ts=1.0)
    assert bound_event_time("worker-events", chunk, NOW_MS) == (chunk, None)
    rec = InputPushed(session_id="s", seq=1, kind="text", payload="x", ts=1.0)
    assert bound_event_time("session-inputs", rec, None) == (rec, None)
    assert bound_event_time("session-inputs", rec, NOW_MS)[0].ts == NOW


def test_a_huge_event_time_is_named_in_a_short_line():
    """ts 1e300 used to print its 300-digit distance from the broker's timestamp in the log."""
    from schemas.codec import bound_event_time
    from schemas.records import SessionOpened

    _, why = bound_event_time("session-events", SessionOpened(session_id="a", ts=1e300), 1_700_000_000_000)
    assert why is not None and "+1e+300 s" in why and len(why) < 200
