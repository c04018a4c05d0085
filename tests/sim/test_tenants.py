"""The eighth workload model's traces (a fifth outside reviewer's): the port draws the reviewer's
own traces, has the shapes it claims, round-trips through a trace file and scales with the
sessions asked for."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from infra.sim.tenants import TENANTS, TenantsConfig, generate_tenants
from processors.lifecycle import EventKind
from tests.sim.model_checks import check_bad_setting, check_closed_trace, check_scale

OPEN, ACTIVE, IDLE, CLOSE = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


@pytest.mark.parametrize("family", TENANTS)
def test_traces_are_seeded_valid_and_round_trip(family, tmp_path):
    cfg = TenantsConfig(family, duration_s=600.0)
    other = TenantsConfig(family, duration_s=600.0, seed=8)
    check_closed_trace(generate_tenants(cfg), generate_tenants(cfg), generate_tenants(other), tmp_path, 600.0, (50, 60_000))


def test_the_port_draws_the_reviewers_traces():
    """The reviewer's own files (its generator, run as it ran it) held these: `desk` seed 1
    1,700 sessions in 18,495 rows, `lobby` seed 2 2,032 in 12,942, `outage` seed 1 2,278 in
    16,058, `desk` seed 1 over an hour 2,532 in 60,792, and left 838, 575, 533 and 1,171
    sessions open, which a trace file's reader closes at the last instant, as the port does
    (the files matched event for event, as compared once)."""
    for (family, duration, seed), (events, sessions) in {("desk", 1200.0, 1): (18_495 + 838, 1_700),
                                                          ("lobby", 1200.0, 2): (12_942 + 575, 2_032),
                                                          ("outage", 1200.0, 1): (16_058 + 533, 2_278),
                                                          ("desk", 3600.0, 1): (60_792 + 1_171, 2_532)}.items():
        drawn = generate_tenants(TenantsConfig(family, duration, 1.0, seed))
        assert (len(drawn), sum(e.kind is OPEN for e in drawn)) == (events, sessions), family


def test_the_desks_second_region_logs_in_later_and_region_a_changes_shift():
    events = generate_tenants(TenantsConfig("desk", 1200.0, 1.0, 3))
    opens: dict[str, list[float]] = defaultdict(list)
    for e in events:
        if e.kind is OPEN:
            opens[e.session_id.split("-")[0]].append(e.t)
    assert len(opens["A1"]) == 600 and set(opens["A1"]) == {0.0}  # region A is there at the start
    assert len(opens["B1"]) == 450 and 0.25 * 1200 <= min(opens["B1"]) and max(opens["B1"]) <= 0.33 * 1200
    change = 0.375 * 1200  # the next shift logs in around the change, overlapping the handover
    assert 550 <= len(opens["A2"]) <= 600 and change - 40 <= min(opens["A2"]) and max(opens["A2"]) <= change + 20
    assert "C1" not in opens and "B2" not in opens
    hour = generate_tenants(TenantsConfig("desk", 3600.0, 1.0, 3))
    c = [e.t for e in hour if e.kind is OPEN and e.session_id.startswith("C1-")]
    assert len(c) == 350 and 0.55 * 3600 <= min(c) and max(c) <= 0.62 * 3600  # a third zone in the hour


def test_a_classrooms_members_go_active_together():
    events = generate_tenants(TenantsConfig("lobby", 1200.0, 1.0, 3))
    members: dict[str, set[str]] = defaultdict(set)
    actives: dict[str, list[float]] = defaultdict(list)
    for e in events:
        tenant = e.session_id.split("-")[0]
        if tenant.startswith("c"):
            members[tenant].add(e.session_id)
            if e.kind is ACTIVE:
                actives[tenant].append(e.t)
    shares = []
    for tenant, times in actives.items():
        times.sort()
        groups = np.split(np.array(times), np.flatnonzero(np.diff(times) > 4.0) + 1)
        assert all(g[-1] - g[0] <= 4.0 for g in groups)  # within 4 s of each other, round by round
        shares += [len(g) / len(members[tenant]) for g in groups]
    assert len(members) == 48 and np.median(shares) > 0.85  # nearly every member of the class


def test_the_outage_drops_most_connected_sessions_within_seconds_and_they_return_as_new_ones():
    events = generate_tenants(TenantsConfig("outage", 1200.0, 1.0, 3))
    closes = np.array([e.t for e in events if e.kind is CLOSE and e.t < events[-1].t])  # not those at the end
    t_drop = max(closes, key=lambda t: ((closes >= t) & (closes < t + 3)).sum())  # the outage
    assert 0.38 * 1200 <= t_drop <= 0.46 * 1200 + 3
    alive: set[str] = set()
    for e in events:
        if e.t >= t_drop:
            break
        if e.kind is OPEN:
            alive.add(e.session_id)
        elif e.kind is CLOSE:
            alive.discard(e.session_id)
    dropped = {e.session_id for e in events if e.kind is CLOSE and t_drop <= e.t < t_drop + 3} & alive
    assert len(dropped) > 0.7 * len(alive) > 100
    back = {e.session_id.split("~")[0]: e.t for e in events
            if e.kind is OPEN and e.session_id.endswith("~r1") and e.t < t_drop + 0.2 * 1200}
    assert len(back.keys() & dropped) > 0.6 * len(dropped)  # the same clients, as new sessions
    assert all(t >= t_drop - 3 + 40 for t in back.values())  # once the service is back, 40 s later


@pytest.mark.parametrize("family", TENANTS)
def test_scale_multiplies_the_sessions(family):
    check_scale(lambda scale: sum(e.kind is OPEN for e in generate_tenants(TenantsConfig(family, 600.0, scale, seed=5))))


@pytest.mark.parametrize("bad", [dict(family="office"), dict(scale=0.0), dict(scale=math.nan), dict(duration_s=0.0),
                                 dict(seed=-1)])
def test_a_bad_setting_is_a_config_error(bad):
    check_bad_setting(TenantsConfig, bad, "desk, lobby, outage")


def test_trace_gen_and_evaluate_name_the_eighth_models_families(tmp_path):
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import TENANTS_SPLIT, TraceSpec, make_trace
    from infra.sim.trace import load_trace

    out = tmp_path / "f.csv"
    ok = CliRunner().invoke(app, ["trace", "gen", "--family", "outage", "--duration", "120", "--sessions", "800", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert list(load_trace(out).events) == generate_tenants(TenantsConfig("outage", 120.0, 0.5, 0))
    assert [s.name for s in TENANTS_SPLIT] == [f"{f}/s{seed}" for seed in (1, 2) for f in TENANTS]
    assert {(s.duration_s, s.sessions) for s in TENANTS_SPLIT} == {(1200.0, 1600)}  # the reviewer's size
    assert make_trace(TraceSpec("lobby", 2, 300.0, 800)).events == tuple(generate_tenants(TenantsConfig("lobby", 300.0, 0.5, 2)))
    split = CliRunner().invoke(app, ["evaluate", "--split", "bogus"])
    assert split.exit_code == 2 and "tenants" in split.output
