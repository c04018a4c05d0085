"""The third workload model's traces (launches) have the shapes they claim, and a trace that
starts empty opens elastic pools on its first minute's demand."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from infra.sim.evaluate import TraceSpec, make_trace
from infra.sim.launches import LAUNCHES, PROBES, LaunchConfig, generate_launch
from infra.sim.report import Runner, compare
from infra.sim.simulator import SimConfig
from infra.sim.trace import Trace, parse_trace, write_trace
from processors.latency import load_profiles
from processors.lifecycle import EventKind

MODEL = load_profiles("paper")


def _gen(family, **kw):
    return generate_launch(LaunchConfig(family, **{"duration_s": 1200.0, "sessions": 1600, **kw}))


def _opens(events):
    return np.array([e.t for e in events if e.kind is EventKind.OPEN])


@pytest.mark.parametrize("family", LAUNCHES + PROBES)
def test_launches_are_valid_reproducible_traces_that_start_empty(family, tmp_path):
    events = _gen(family, duration_s=300.0, sessions=300)
    assert events == _gen(family, duration_s=300.0, sessions=300)
    assert events != _gen(family, duration_s=300.0, sessions=300, seed=1)
    assert sum(e.t == events[0].t for e in events) < 5  # no population at the start
    write_trace(events, tmp_path / "t.csv")
    with open(tmp_path / "t.csv", newline="") as fh:
        assert len(parse_trace(csv.reader(fh)).events) == len(events)


def test_each_family_has_its_shape():
    avatar, flicker, ramp, big, spiky, mmpp = (_gen(f) for f in ("avatar", "flicker", "ramp", "bigstate", "spiky", "mmpp"))
    assert not any(e.kind is EventKind.IDLE for e in avatar)
    assert sum(e.kind is EventKind.IDLE for e in flicker) > 5 * sum(e.kind is EventKind.IDLE for e in mmpp) / 2
    assert not np.any(_opens(ramp) > 0.75 * 1200.0)
    assert min(e.state_bytes for e in big if e.kind is EventKind.OPEN) >= 5e9
    per5 = np.bincount((_opens(spiky) // 5).astype(int))
    assert per5.max() >= 60 > 5 * np.median(per5)  # a crowd of 60 within 5 s; about 7 per 5 s otherwise
    per_min = np.bincount((_opens(mmpp) // 60).astype(int))
    assert per_min.max() > 3 * max(1, per_min.min())  # regimes far apart


def _executing(events, step_s):
    """The most sessions executing (open and not idle) in each ``step_s`` of the trace."""
    now, out = set(), {}
    for e in events:
        if e.kind in (EventKind.OPEN, EventKind.ACTIVE):
            now.add(e.session_id)
        else:
            now.discard(e.session_id)
        b = int(e.t // step_s)
        out[b] = max(out.get(b, 0), len(now))
    return np.array([out.get(b, 0) for b in range(max(out) + 1)])


def test_the_probes_never_idle_and_churn_steadily_or_swing_every_150_s():
    churn, periodic = _gen("churn"), _gen("periodic")
    for events in (churn, periodic):
        assert not any(e.kind is EventKind.IDLE for e in events)
    lives = {}
    for e in churn:
        lives[e.session_id] = e.t - lives[e.session_id] if e.session_id in lives else e.t
    assert 20.0 < np.mean(list(lives.values())) < 35.0  # about 30 s each (cut at the trace's end)
    assert len(_opens(churn)) > 7 * 1600
    steady = _executing(churn, 60.0)[2:19]  # past the launch, before the end
    assert steady.min() > 0.8 * steady.max()  # a few hundred executing, swinging only by chance
    at = _executing(periodic, 5.0)  # the rate peaks at 37.5 s of each 150 s, the load a little later
    for k in range(1, 7):
        assert at[(150 * k + 50) // 5] > 1.5 * at[(150 * k + 125) // 5]


def test_a_launch_opens_elastic_pools_on_its_first_minute_and_a_mid_stream_trace_does_not():
    k = MODEL["b300"].capacity
    launch = Runner(make_trace(TraceSpec("avatar", 0)), MODEL, SimConfig(warm_start=True))
    first = max(launch.future[:5])  # the windows of the first two boot times (60 s boots, 30 s windows)
    assert first > k and launch.elastic_start == math.ceil(first / k)
    assert launch.run("turboserve").worst_chunk_latency_s < 3.0  # no session waits out a boot at the start
    assert compare(launch, ("turboserve",))["trace"]["opening_gpus"] == launch.elastic_start
    mid = Runner(make_trace(TraceSpec("calm", 0, duration_s=120.0, sessions=200)), MODEL, SimConfig(warm_start=True))
    assert mid.elastic_start == 0
    cold = Runner(Trace(mid.trace.events, "calm"), MODEL, SimConfig(warm_start=False))
    assert cold.elastic_start >= 1


def test_trace_gen_and_evaluate_name_the_launch_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app

    out = tmp_path / "a.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "avatar", "--duration", "120", "--sessions", "100", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert out.read_text().splitlines()[0] == "t_s,session_id,event,state_mb"
    bad = CliRunner().invoke(app, ["trace", "gen", "--family", "nope", "-o", str(tmp_path / "b.csv")])
    assert bad.exit_code == 2 and "mmpp" in bad.output and "calm" in bad.output and "Traceback" not in bad.output
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "launch" in split.output and "probe" in split.output
    probe = CliRunner().invoke(app, ["trace", "gen", "--family", "periodic", "--duration", "120", "--sessions", "100", "-o", str(out)])
    assert probe.exit_code == 0, probe.output
    only = CliRunner().invoke(app, ["evaluate", "--split", "launch", "--only", "ramp/s0,nosuch"])
    assert only.exit_code == 2 and "nosuch" in only.output and "ramp/s0" in only.output  # runs nothing, says why
    empty = CliRunner().invoke(app, ["evaluate", "--split", "launch", "--only", " , "])  # ran the whole split
    assert empty.exit_code == 2 and "--only: names no trace" in empty.output
