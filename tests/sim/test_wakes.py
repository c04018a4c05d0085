"""The ninth workload model's traces (a sixth outside reviewer's): the port draws the reviewer's
own traces, has the shapes it claims, round-trips through a trace file and scales with the
sessions asked for."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from infra.sim.trace import MB
from infra.sim.wakes import WAKES, WakesConfig, generate_wakes
from processors.lifecycle import EventKind
from tests.sim.model_checks import check_bad_setting, check_closed_trace, check_scale

OPEN, ACTIVE, IDLE, CLOSE = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


@pytest.mark.parametrize("family", WAKES)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg = WakesConfig(family, duration_s=300.0, scale=0.5)
    other = WakesConfig(family, duration_s=300.0, scale=0.5, seed=8)
    check_closed_trace(generate_wakes(cfg), generate_wakes(cfg), generate_wakes(other), tmp_path, 300.0, (300, 64_000))


def test_the_port_draws_the_reviewers_traces():
    """The reviewer's own files (its generator, run as it ran it: `--sessions 1500` for
    lurkers, `--sessions 40 --spikes 1` and `--sessions 60` for the night shift) held these:
    `avatars` (here `turns`) seed 1 1,921 sessions in 144,930 rows, `nightshift` seeds 1 and
    2 119 in 800 and 201 in 1,357, `lurkers` seed 2 1,912 in 14,293; the port's are the same
    (the files matched event for event, as compared once)."""
    for cfg, counts in {WakesConfig("turns", 1200.0, 1.0, 1): (144_930, 1_921),
                        WakesConfig("nightshift", 1200.0, 40 / 1600, 1, crowds=1): (800, 119),
                        WakesConfig("nightshift", 1200.0, 60 / 1600, 2): (1_357, 201),
                        WakesConfig("lurkers", 1200.0, 1500 / 1600, 2): (14_293, 1_912)}.items():
        events = generate_wakes(cfg)
        assert (len(events), sum(e.kind is OPEN for e in events)) == counts, cfg


def _spells(events, first: EventKind, then: EventKind) -> list[float]:
    """Lengths of the spells that start with a ``first`` row and end with a ``then`` row."""
    since: dict[str, float] = {}
    out = []
    for e in events:
        if e.kind is then and e.session_id in since:
            out.append(e.t - since.pop(e.session_id))
        if e.kind is first:
            since[e.session_id] = e.t
        elif e.kind is CLOSE:
            since.pop(e.session_id, None)
    return out


def test_turns_alternate_short_replies_and_short_pauses():
    events = generate_wakes(WakesConfig("turns", 600.0, 0.5, 3))
    replies, pauses = np.array(_spells(events, ACTIVE, IDLE)), np.array(_spells(events, IDLE, ACTIVE))
    assert len(replies) > 5000 and replies.min() >= 3 - 0.01 and replies.max() <= 12 + 0.01
    assert len(pauses) > 5000 and pauses.min() >= 2 - 0.01 and pauses.max() <= 10 + 0.01
    alive_at_0 = sum(e.kind is OPEN and e.t == 0 for e in events)
    assert alive_at_0 == int(800 * 0.2)  # mid-stream: a fifth of the expected sessions


def test_a_night_shift_is_small_until_a_crowd_arrives_within_seconds():
    events = generate_wakes(WakesConfig("nightshift", 1200.0, 40 / 1600, 5, crowds=1))
    crowd = sorted(e.t for e in events if e.kind is OPEN and e.session_id.startswith("sp"))
    assert 40 <= len(crowd) <= 90 and crowd[-1] - crowd[0] <= 12 and 0.15 * 1200 <= crowd[0] <= 0.85 * 1200
    background = [e for e in events if e.kind is OPEN and e.session_id.startswith("ns")]
    assert 20 <= len(background) <= 70  # 5 at the start and about 40 arrivals
    two = generate_wakes(WakesConfig("nightshift", 1200.0, 40 / 1600, 5))  # the reviewer's default: two crowds
    starts = sorted(e.t for e in two if e.kind is OPEN and e.session_id.startswith("sp"))
    assert 80 <= len(starts) <= 180 and len(np.flatnonzero(np.diff(starts) > 12)) <= 1


def test_heavy_states_are_large_and_grow_at_each_idle():
    events = generate_wakes(WakesConfig("heavystate", 1200.0, 1.0, 3))
    sizes: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.state_bytes:
            sizes[e.session_id].append(e.state_bytes // MB)
        assert e.kind in (OPEN, IDLE) or not e.state_bytes  # a size on the open and each offload
    opened = np.array([s[0] for s in sizes.values()])
    assert opened.min() >= 2000 and opened.max() <= 64_000 and 0.03 < (opened >= 24_000).mean() < 0.08
    assert all(a <= b <= 64_000 for s in sizes.values() for a, b in zip(s, s[1:]))
    assert sum(s[-1] > s[0] for s in sizes.values()) > 0.5 * len(sizes)


def test_lurkers_mostly_open_idle_and_wake_together():
    events = generate_wakes(WakesConfig("lurkers", 1200.0, 1500 / 1600, 3))
    opened: dict[str, float] = {}
    first_idle: dict[str, float] = {}
    for e in events:
        if e.kind is OPEN:
            opened[e.session_id] = e.t
        elif e.kind is IDLE:
            first_idle.setdefault(e.session_id, e.t)
    quiet = sum(s in first_idle and first_idle[s] - t <= 4.0 for s, t in opened.items())
    assert quiet > 0.6 * len(opened)  # idle at once, or after a first spell of at most 4 s
    wakes = np.array([e.t for e in events if e.kind is ACTIVE])
    for lo, hi in ((0.3, 0.45), (0.7, 0.85)):  # one mass wake in each window, within 4 s
        t = max(wakes[(wakes >= lo * 1200) & (wakes < hi * 1200)], key=lambda x: ((wakes >= x) & (wakes < x + 4)).sum())
        woke = ((wakes >= t) & (wakes < t + 4)).sum()
        open_then = sum(o <= t < c for o, c in ((opened[e.session_id], e.t) for e in events if e.kind is CLOSE))
        assert woke > 0.25 * open_then > 100


@pytest.mark.parametrize("family", WAKES)
def test_scale_multiplies_the_sessions(family):
    check_scale(lambda scale: sum(e.kind is OPEN for e in generate_wakes(WakesConfig(family, 300.0, scale, seed=5))))


@pytest.mark.parametrize("bad", [dict(family="avatar"), dict(scale=0.0), dict(scale=math.nan), dict(duration_s=0.0),
                                 dict(seed=-1), dict(crowds=-1)])
def test_a_bad_setting_is_a_config_error(bad):
    check_bad_setting(WakesConfig, bad, "turns, nightshift, heavystate, lurkers")


def test_trace_gen_and_evaluate_name_the_ninth_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import WAKES_SPLIT, TraceSpec, make_trace
    from infra.sim.trace import load_trace

    out = tmp_path / "f.csv"
    args = ["trace", "gen", "--family", "nightshift", "--sessions", "40", "--crowds", "1", "--seed", "1", "--duration", "1200"]
    ok = CliRunner().invoke(app, [*args, "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events) == generate_wakes(WakesConfig("nightshift", 1200.0, 40 / 1600, 1, crowds=1))
    bad = CliRunner().invoke(app, ["trace", "gen", "--family", "lurkers", "--crowds", "1", "-o", str(out)])
    assert bad.exit_code == 2 and "--crowds" in bad.output
    assert [s.name for s in WAKES_SPLIT] == [f"{f}/s{seed}" for seed in (1, 2) for f in WAKES]
    sizes = {s.name: (s.sessions, s.crowds) for s in WAKES_SPLIT}  # the reviewer's
    assert sizes["nightshift/s1"] == (40, 1) and sizes["nightshift/s2"] == (60, 2) and sizes["lurkers/s2"] == (1500, None)
    assert make_trace(TraceSpec("heavystate", 2, 300.0, 800)).events == tuple(generate_wakes(WakesConfig("heavystate", 300.0, 0.5, 2)))
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "wakes" in split.output
