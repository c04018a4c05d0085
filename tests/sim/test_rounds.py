"""The eleventh workload model's traces (sessions in rounds): seeded, valid, round-tripping
through a trace file, with the rounds, breaks and returns it claims, and sized by the sessions
asked for."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from infra.sim.rounds import ROUNDS, RoundsConfig, _SHAPE, generate_rounds
from processors.lifecycle import EventKind
from tests.sim.model_checks import check_bad_setting, check_closed_trace, check_scale

OPEN, ACTIVE, IDLE, CLOSE = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


@pytest.mark.parametrize("family", ROUNDS)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg = RoundsConfig(family, duration_s=600.0)
    other = RoundsConfig(family, duration_s=600.0, seed=8)
    check_closed_trace(generate_rounds(cfg), generate_rounds(cfg), generate_rounds(other), tmp_path, 600.0, (50, 20_000))


def _executing(events, t: float) -> int:
    """Sessions executing just after ``t``."""
    n = 0
    for e in events:
        if e.t > t:
            break
        n += {OPEN: 1, ACTIVE: 1, IDLE: -1}.get(e.kind, 0) - (e.kind is CLOSE and _was_executing(events, e))
    return n


def _was_executing(events, close) -> bool:
    last = [e.kind for e in events if e.session_id == close.session_id and e.t <= close.t and e.kind is not CLOSE]
    return last[-1] is not IDLE


@pytest.mark.parametrize("family", ROUNDS)
def test_every_seat_plays_from_the_first_instant_and_a_break_idles_its_share(family):
    events = generate_rounds(RoundsConfig(family, 1200.0, 1.0, 3))
    round_s, break_s, share = _SHAPE[family]
    assert sum(e.kind is OPEN and e.t == 0.0 for e in events) == 600  # mid-round: every seat open at 0
    idles = sorted(e.t for e in events if e.kind is IDLE)
    first = idles[0]
    assert 0.85 * round_s <= first <= 1.15 * round_s  # the first break starts one round in
    burst = [t for t in idles if t < first + 11.0]
    assert 0.8 * share * 600 < len(burst) < 1.2 * share * 600  # its share of the seats go idle within the jitter
    back = sorted(e.t for e in events if e.kind is ACTIVE and e.t > first)
    assert 0.85 * break_s <= back[0] - first <= 1.15 * break_s + 10.0  # and come back at the next round
    assert _executing(events, back[0] + 10.0) > 0.95 * _executing(events, first - 1.0)


def test_sessions_only_leave_by_closing_and_seats_are_taken_again():
    events = generate_rounds(RoundsConfig("lesson", 1200.0, 1.0, 4))
    kinds = Counter(e.kind for e in events)
    assert kinds[OPEN] == kinds[CLOSE] > 600  # users leave (exponential stays) and new ones take their seats
    ends = [e for e in events if e.kind is CLOSE and e.t < 1200.0]
    assert ends and all(e.t > 0 for e in ends)


def test_scale_multiplies_the_seats():
    check_scale(lambda s: sum(e.kind is OPEN and e.t == 0.0 for e in generate_rounds(RoundsConfig("quiz", 300.0, s, 1))))


@pytest.mark.parametrize("bad", [dict(family="desk"), dict(scale=0.0), dict(scale=math.nan), dict(duration_s=0.0),
                                 dict(seed=-1), dict(jitter_s=-1.0)])
def test_a_bad_setting_is_a_config_error(bad):
    check_bad_setting(RoundsConfig, bad, "quiz, match, lesson")


def test_trace_gen_and_evaluate_name_the_eleventh_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import ROUNDS_SPLIT, TraceSpec, make_trace
    from infra.sim.trace import load_trace

    out = tmp_path / "r.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "match", "--sessions", "800", "--seed", "3", "--duration", "300", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events) == generate_rounds(RoundsConfig("match", 300.0, 0.5, 3))
    assert make_trace(TraceSpec("quiz", 2, 300.0, 800)).events == tuple(generate_rounds(RoundsConfig("quiz", 300.0, 0.5, 2)))
    assert [s.name for s in ROUNDS_SPLIT] == [f"{f}/s{seed}" for f in ROUNDS for seed in (1, 2)]
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "rounds" in split.output
