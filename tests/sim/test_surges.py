"""The sixth workload model's traces (a third outside reviewer's) have the shapes they claim,
at full length and stretched to a shorter trace, round-trip through a trace file and scale
with the sessions asked for."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from infra.sim.surges import SURGES, SurgeConfig, generate_surge
from infra.sim.trace import MB, parse_trace, write_trace
from processors.lifecycle import EventKind, SessionEvent
from tests.sim.model_checks import check_bad_setting, check_closed_trace, check_scale

OPEN, ACTIVE, IDLE, CLOSE = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


def _executing(events: list[SessionEvent], end: float, step: float = 1.0) -> np.ndarray:
    """Sessions executing at each multiple of ``step`` (index = seconds when step is 1)."""
    running: set[str] = set()
    out, i, at = [], 0, 0.0
    while at < end:
        while i < len(events) and events[i].t <= at:
            e = events[i]
            (running.add if e.kind in (OPEN, ACTIVE) else running.discard)(e.session_id)
            i += 1
        out.append(len(running))
        at += step
    return np.array(out)


def _times(events: list[SessionEvent], kind: EventKind, prefix: str = "") -> dict[str, float]:
    return {e.session_id: e.t for e in events if e.kind is kind and e.session_id.startswith(prefix)}


@pytest.mark.parametrize("family", SURGES)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg, other = SurgeConfig(family, duration_s=600.0), SurgeConfig(family, duration_s=600.0, seed=8)
    events = generate_surge(cfg)
    check_closed_trace(events, generate_surge(cfg), generate_surge(other), tmp_path, 600.0, None, least=300)
    assert all(e.state_bytes > 0 for e in events if e.kind is OPEN)
    assert all(e.state_bytes == 0 for e in events if e.kind in (IDLE, CLOSE))


def test_a_shorter_trace_closes_its_sessions_at_its_end(tmp_path):
    for family in SURGES:
        events = generate_surge(SurgeConfig(family, duration_s=90.0, seed=3))
        write_trace(events, tmp_path / "t.csv")
        with open(tmp_path / "t.csv", newline="", encoding="utf-8") as fh:
            assert list(parse_trace(csv.reader(fh)).events) == events
        assert events and events[-1].t <= 90.0
        assert len(_times(events, OPEN)) == len(_times(events, CLOSE))


def failover_shape(events: list[SessionEvent], duration: float, scale: float = 1.0) -> None:
    f = duration / 1200
    t_fail, t_back = round(600 * f), 960 * f
    x = _executing(events, duration)
    assert sum(e.t == 0 for e in events if e.kind is OPEN) == round(250 * scale)  # mid-stream
    assert x[t_fail:t_fail + 31].max() - x[t_fail - 1] >= 0.5 * 500 * scale  # the region arrives executing
    opened, closed = _times(events, OPEN, "f"), _times(events, CLOSE, "f")
    assert len(opened) == round(500 * scale) and all(t_fail <= t <= t_fail + 20.001 for t in opened.values())
    assert sum(t <= t_fail + 4.001 for t in opened.values()) > 0.6 * len(opened)  # 70% within 4 s
    alive = [s for s in opened if closed[s] >= t_back]  # still there at the failback
    back = [s for s in alive if closed[s] <= t_back + 10.001]
    assert len(alive) > 50 * scale and len(back) > 0.5 * len(alive)  # most leave within 10 s
    tb, xf = math.floor(t_back), _executing([e for e in events if e.session_id.startswith("f")], duration)
    assert xf[tb + 11] < 0.6 * xf[tb - 1]  # and those executing fall by well over a third


def heavyvid_shape(events: list[SessionEvent], duration: float) -> None:
    f = duration / 1200
    assert _executing(events, duration)[0] == 0 and min(e.t for e in events) > 0  # starts empty
    sized = [e for e in events if e.state_bytes]
    assert {e.kind for e in sized} == {OPEN, ACTIVE}  # the grown state rides on the return
    assert all(5000 * MB <= e.state_bytes <= 20000 * MB for e in sized)
    last: dict[str, int] = {}
    grew = 0
    for e in sized:
        assert e.state_bytes >= last.get(e.session_id, 0)  # states only grow
        grew += e.state_bytes > last.get(e.session_id, e.state_bytes)
        last[e.session_id] = e.state_bytes
    assert grew > 0.5 * sum(e.kind is ACTIVE for e in events)
    returns = np.array([e.t for e in events if e.kind is ACTIVE])
    assert len(returns) > 100
    assert np.mean(returns % (150 * f) < 6.5) > 0.5  # most returns at a review wave (6.5 s of every 150)
    idle_at: dict[str, float] = {}
    gaps = []
    for e in events:
        if e.kind is IDLE:
            idle_at[e.session_id] = e.t
        elif e.kind is ACTIVE:
            gaps.append(e.t - idle_at[e.session_id])
    assert np.median(gaps) > 60  # idle gaps of minutes


def liveevent_shape(events: list[SessionEvent], duration: float) -> None:
    f = duration / 1200
    ts, th, tr, te = (round(t * f) for t in (300, 720, 840, 1140))
    lobby = {s: t for s, t in _times(events, OPEN).items() if t < ts}
    idle_at_open = {e.session_id for e in events if e.kind is IDLE and lobby.get(e.session_id) == e.t}
    assert len(lobby) > 40 and len(idle_at_open) > 0.55 * len(lobby)  # the lobby mostly opens idle
    x = _executing(events, duration)
    assert x[ts - 1] < 0.5 * len(lobby) and x[ts + 5] - x[ts - 1] > 250  # the show starts within seconds
    assert x[th - 1] > 400 and x[th + 3] < 0.4 * x[th - 1]  # half-time: most go idle within 2 s
    assert x[tr - 1] < 0.4 * x[th - 1] and x[tr + 6] > 0.6 * x[th - 1]  # and come back at the return
    closes = np.array(list(_times(events, CLOSE).values()))
    assert x[te - 1] > 300 and np.sum(closes >= te) > 0.9 * x[te - 1] and closes.max() <= te + 30.001  # show end


@pytest.mark.parametrize("duration", [1200.0, 600.0])
def test_each_family_has_its_shape(duration):
    failover_shape(generate_surge(SurgeConfig("failover", duration)), duration)
    heavyvid_shape(generate_surge(SurgeConfig("heavyvid", duration)), duration)
    liveevent_shape(generate_surge(SurgeConfig("liveevent", duration)), duration)


@pytest.mark.parametrize("family", SURGES)
def test_scale_multiplies_the_sessions(family):
    check_scale(lambda scale: len(_times(generate_surge(SurgeConfig(family, 600.0, scale, seed=5)), OPEN)), (0.4, 0.6), (1.7, 2.3))


def test_a_scaled_failover_scales_its_populations():
    failover_shape(generate_surge(SurgeConfig("failover", scale=0.5)), 1200.0, scale=0.5)


@pytest.mark.parametrize("bad", [dict(family="weekly"), dict(scale=0.0), dict(scale=-1.0), dict(scale=math.nan),
                                 dict(scale=math.inf), dict(duration_s=0.0), dict(duration_s=math.nan), dict(seed=-1)])
def test_a_bad_setting_is_a_config_error(bad):
    check_bad_setting(SurgeConfig, bad, "failover, heavyvid, liveevent")


def test_trace_gen_and_evaluate_name_the_sixth_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import SURGE_SPLIT, TraceSpec, make_trace
    from infra.sim.trace import load_trace

    out = tmp_path / "f.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "liveevent", "--duration", "120", "--sessions", "200", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events) == generate_surge(SurgeConfig("liveevent", 120.0, 200 / 1600, 0))
    assert [s.name for s in SURGE_SPLIT] == ["failover/s7", "heavyvid/s7", "liveevent/s7"]
    assert make_trace(TraceSpec("failover", 7, 300.0, 800)).events == tuple(generate_surge(SurgeConfig("failover", 300.0, 0.5, 7)))
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "surge" in split.output
    only = CliRunner().invoke(app, ["evaluate", "--split", "surge", "--only", "failover/s0"])
    assert only.exit_code == 2 and "failover/s7" in only.output  # the split's seed is named
