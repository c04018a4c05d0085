"""Trace validation: every bad case names the file, the line and the reason."""

from __future__ import annotations

import pytest

from infra.sim.trace import MB, load_trace, write_trace
from infra.sim.tracegen import GenConfig, fall, generate
from processors.lifecycle import EventKind, SessionState, transition
from schemas.errors import TraceError

HEAD = "t_s,session_id,event,state_mb\n"


def _load(tmp_path, body: str, head: str = HEAD):
    p = tmp_path / "t.csv"
    p.write_text(head + body)
    return load_trace(p)


@pytest.mark.parametrize(
    "body, line, reason",
    [
        ("1,a,open,10\n0.5,a,close,\n", 3, "backwards"),
        ("0,a,open,10\n1,a,explode,\n", 3, "unknown event"),
        ("0,a,active,\n", 2, "before open"),
        ("0,a,open,1\n1,a,close,\n2,a,idle,\n", 4, "after close"),
        ("0,a,open,1\n1,a,open,1\n", 3, "duplicate open"),
        ("0,a,open,1\n1,a,close,\n2,a,open,1\n", 4, "after its close: a session id is not used again"),
        ("zero,a,open,1\n", 2, "not a number"),
        ("-1,a,open,1\n", 2, ">= 0"),
        ("0,a,open,-5\n", 2, ">= 0"),
        ("0,a,open,lots\n", 2, "not a number"),
        ("0,a\n", 2, "missing columns"),
        ("0,a,open,100,extra\n", 2, "more columns than the header"),  # a shifted column, not ignored
        ("0,a,open,1\n1e300,a,close,\n", 3, "over the 1,000,000"),  # a replay that would never end
        ("0,a,open,1e300\n", 2, "over the 1,048,576"),
        ("1_000,a,open,1\n", 2, "not a number"),  # Python's float reads it; a CSV number does not
        ("0,a,open,2_000\n", 2, "not a number"),
    ],
)
def test_bad_rows(tmp_path, body, line, reason):
    with pytest.raises(TraceError) as err:
        _load(tmp_path, body)
    assert err.value.line == line and reason in err.value.reason
    assert str(tmp_path / "t.csv") in str(err.value)


def test_a_missing_file_is_named_without_a_line(tmp_path):
    with pytest.raises(TraceError) as err:
        load_trace(tmp_path / "nofile.csv")
    assert str(err.value) == f"{tmp_path / 'nofile.csv'}: cannot read (No such file or directory)"


def test_trailing_empty_cells_are_accepted(tmp_path):
    assert _load(tmp_path, "0,a,open,1,,\n1,a,close,\n").sessions == 1


def test_missing_header_column(tmp_path):
    with pytest.raises(TraceError, match="lacks column"):
        _load(tmp_path, "0,a\n", head="t_s,session_id\n")
    with pytest.raises(TraceError) as err:  # what it names instead is said (an outside run's `T_S`)
        _load(tmp_path, "0,a,open,1\n", head="T_S,Session_ID,Event,State_MB\n")
    assert err.value.reason.startswith("header lacks column(s) t_s, session_id, event and names 'T_S', 'Session_ID', "
                                       "'Event' instead (need t_s,session_id,event[,state_mb], lowercase)")


def test_an_empty_file_is_named_as_empty(tmp_path):
    """It read as a header lacking every column."""
    with pytest.raises(TraceError) as err:
        _load(tmp_path, "", head="")
    assert err.value.line == 1 and "empty" in err.value.reason


@pytest.mark.parametrize("head", ["t_s,session_id,event,state_MB\n", "t_s,session_id,event,state_mb,note\n"])
def test_an_unknown_header_column_is_named_not_ignored(tmp_path, head):
    """`state_MB` left every session's size at 0 without a word."""
    with pytest.raises(TraceError) as err:
        _load(tmp_path, "0,a,open,500000\n", head=head)
    assert err.value.line == 1 and "unknown column(s)" in err.value.reason


@pytest.mark.parametrize("head", ["t_s,session_id,event,event\n", "t_s,session_id,event,state_mb,state_mb\n"])
def test_a_column_named_twice_is_refused(tmp_path, head):
    """Which of the two holds the value would be a guess (the first was read)."""
    with pytest.raises(TraceError) as err:
        _load(tmp_path, "0,a,open,close\n", head=head)
    assert err.value.line == 1 and "twice" in err.value.reason


def test_event_names_ignore_case_and_cells_their_surrounding_spaces(tmp_path):
    """As docs/simulator.md says: `OPEN` is `open`, and ` a ` is session `a`."""
    tr = _load(tmp_path, "0, a ,OPEN,1\n1,a, Idle ,\n2,a,close,\n")
    assert [(e.session_id, e.kind) for e in tr.events] == [("a", EventKind.OPEN), ("a", EventKind.IDLE), ("a", EventKind.CLOSE)]


def test_open_sessions_close_at_end(tmp_path):
    tr = _load(tmp_path, "0,a,open,1.5\n2,b,open,\n3,b,close,\n7,c,open,\n")
    closes = {e.session_id: e.t for e in tr.events if e.kind is EventKind.CLOSE}
    assert closes == {"b": 3.0, "a": 7.0, "c": 7.0}
    assert tr.events[0].state_bytes == 1_500_000 and tr.sessions == 3 and tr.duration_s == 7.0


def test_generated_trace_round_trips_and_is_seeded(tmp_path):
    cfg = GenConfig(level=7, duration_s=300, sessions=200, seed=3)
    ev = generate(cfg)
    assert ev == generate(cfg) and ev != generate(GenConfig(level=7, duration_s=300, sessions=200, seed=4))
    write_trace(ev, tmp_path / "g.csv")
    tr = load_trace(tmp_path / "g.csv")
    assert len(tr.events) == len(ev) and tr.sessions == sum(e.kind is EventKind.OPEN for e in ev)


def test_a_fall_leaves_the_sessions_kept_running_and_closes_the_rest():
    ev = generate(GenConfig(level=5, duration_s=720, sessions=60, seed=0, life_median_s=120.0, state_median_mb=8.0))
    out = fall(ev, 396.0, 4, 720.0, over_s=20.0)
    assert out[: sum(e.t < 396.0 for e in ev)] == [e for e in ev if e.t < 396.0]  # the rise as generated
    assert [e.t for e in out] == sorted(e.t for e in out)
    later = [e for e in out if e.t >= 396.0]
    assert not any(e.kind is EventKind.OPEN for e in later)
    state = _states(out, 416.0)  # the closes are spread over [396, 416)
    kept = {s for s, st in state.items() if st is SessionState.EXECUTION}
    assert len(kept) == 4 and not any(st is SessionState.SUSPENDED for st in state.values())
    assert {e.session_id for e in later if e.t == 720.0} == kept  # they run on to the end
    assert all(e.kind is EventKind.CLOSE for e in later if e.session_id not in kept)
    executing = [s for s, st in _states(ev, 396.0).items() if st is SessionState.EXECUTION]
    assert executing[0] in kept and executing[-1] in kept  # spread over the order they opened in


def _states(events, until):
    """Each session's lifecycle state after the events before ``until``."""
    state: dict = {}
    for e in events:
        if e.t >= until:
            break
        state[e.session_id] = transition(state.get(e.session_id), e.kind)[0]
    return state


def test_tune_fills_levels_no_trace_reads_from_the_nearest_written():
    from infra.sim.tune import fill_unread

    entries = tuple((0.9 - 0.05 * i, 0.05) for i in range(10))
    out = fill_unread(entries, {1, 5, 10})
    assert out[0] == entries[0] and out[4] == entries[4] and out[9] == entries[9]
    assert out[1] == entries[0] and out[3] == out[5] == out[6] == entries[4]
    assert out[7] == out[8] == entries[9]
    assert out[2] == entries[4]  # level 3: 1 and 5 are as near; the more conservative (lower u*) wins
    assert fill_unread(entries, set()) == entries


def test_the_readmes_example_trace_reads_as_it_says(tmp_path):
    """The README's example is a valid trace: two sessions, one opening idle, a size given again on a return."""
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = readme.split("The trace format, a CSV file:", 1)[1].split("```", 2)[1].strip() + "\n"
    path = tmp_path / "example.csv"
    path.write_bytes(("\ufeff" + block).replace("\n", "\r\n").encode())  # with a byte-order mark and CRLF, as said
    tr = load_trace(path)
    closes = {e.session_id: e.t for e in tr.events if e.kind is EventKind.CLOSE}
    assert tr.sessions == 2 and closes == {"u1": 300.0, "u2": 300.0}  # u2, still open at the last row, closed there
    sizes = {(e.session_id, e.kind): e.state_bytes for e in tr.events}
    assert sizes[("u1", EventKind.ACTIVE)] == 2400 * MB and sizes[("u2", EventKind.IDLE)] == 0
    assert [e.kind for e in tr.events if e.session_id == "u2"][:2] == [EventKind.OPEN, EventKind.IDLE]
