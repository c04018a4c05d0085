"""The seventh workload model's traces (a fourth outside reviewer's): the port reproduces the
reviewer's own trace files, has the shapes it claims, round-trips through a trace file and
scales with the sessions asked for."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infra.sim.steps import LEVELS, STEPS, StepsConfig, _Model, generate_steps
from processors.lifecycle import EventKind
from tests.sim.model_checks import check_bad_setting, check_closed_trace, check_scale

OPEN, ACTIVE, IDLE, CLOSE = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


@pytest.mark.parametrize("family", STEPS)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg = StepsConfig(family, duration_s=600.0)
    other = StepsConfig(family, duration_s=600.0, seed=8)
    check_closed_trace(generate_steps(cfg), generate_steps(cfg), generate_steps(other), tmp_path, 600.0, (50, 20_000))


def test_the_port_draws_the_reviewers_traces():
    """The reviewer's own files (its generator, run as it ran it) held these: `plateau` seed 1
    3,330 sessions in 20,122 rows, `combo` (here `mixed`) seed 2 over an hour 7,540 sessions in
    47,651 rows; the port's counts are the same (the twenty-minute files matched it row for row,
    as compared once)."""
    plateau = generate_steps(StepsConfig("plateau", 1200.0, 1.0, 1))
    assert (len(plateau), sum(e.kind is OPEN for e in plateau)) == (20_122, 3_330)
    mixed = generate_steps(StepsConfig("mixed", 3600.0, 1.0, 2))
    assert (len(mixed), sum(e.kind is OPEN for e in mixed)) == (47_651, 7_540)


def test_plateaus_and_arrivals_follow_the_multipliers():
    model = _Model(StepsConfig("plateau", 3600.0, 1.0, 3))
    cuts = model.cuts
    assert all(level in LEVELS for _, level in cuts) and all(a[1] != b[1] for a, b in zip(cuts, cuts[1:]))
    assert all(180 <= b[0] - a[0] <= 480 for a, b in zip(cuts, cuts[1:]))
    arrivals, waves = model.instants()
    assert waves == []  # no waves in this family
    at = np.array(arrivals)
    for level in LEVELS:  # arrivals per second in the spans at each level: the base rate times it
        spans = [(a[0], b[0]) for a, b in zip(cuts, cuts[1:]) if a[1] == level]
        seconds = sum(b - a for a, b in spans)
        count = sum(((at >= a) & (at < b)).sum() for a, b in spans)
        if seconds > 600:
            assert count / seconds == pytest.approx(model.base * level, rel=0.2), level


def test_waves_close_short_sessions_together_and_bring_arrivals_after():
    model = _Model(StepsConfig("waves", 1200.0, 1.0, 1))
    arrivals, waves = model.instants()
    assert 3 <= len([w for w in waves if w >= 0]) <= 20  # a wave every 150 s on average
    events = generate_steps(StepsConfig("waves", 1200.0, 1.0, 1))
    closes = np.array([e.t for e in events if e.kind is CLOSE and e.t < 1200.0])
    after = [((closes >= w) & (closes < w + 5)).sum() for w in waves if 0 <= w < 1195]
    assert np.median(after) > 5 * len(closes) / 1200 * 5  # many times the background within a wave's 5 s


@pytest.mark.parametrize("family", STEPS)
def test_scale_multiplies_the_sessions(family):
    check_scale(lambda scale: sum(e.kind is OPEN for e in generate_steps(StepsConfig(family, 600.0, scale, seed=5))))


@pytest.mark.parametrize("bad", [dict(family="weekly"), dict(scale=0.0), dict(scale=math.nan), dict(duration_s=0.0),
                                 dict(seed=-1)])
def test_a_bad_setting_is_a_config_error(bad):
    check_bad_setting(StepsConfig, bad, "plateau, waves, pareto, mixed")


def test_trace_gen_and_evaluate_name_the_seventh_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import STEPS_SPLIT, TraceSpec, make_trace
    from infra.sim.trace import load_trace

    out = tmp_path / "f.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "pareto", "--duration", "120", "--sessions", "800", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events) == generate_steps(StepsConfig("pareto", 120.0, 0.5, 0))
    assert [s.name for s in STEPS_SPLIT] == [f"{f}/s{seed}" for seed in (1, 2) for f in STEPS]
    assert make_trace(TraceSpec("mixed", 2, 300.0, 800)).events == tuple(generate_steps(StepsConfig("mixed", 300.0, 0.5, 2)))
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "steps" in split.output
