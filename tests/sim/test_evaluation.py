"""The paper's evaluation: pinned baselines, restores on any state move, plug-ins as subjects, the SLO."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from infra.sim.report import Runner, compare
from infra.sim.simulator import SimConfig, simulate
from infra.sim.trace import Trace, write_trace
from infra.sim.tracegen import GenConfig, generate
from processors.autoscaler import Slo
from processors.volatility import load_volatility_table
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import EventKind, SessionEvent
from processors.policy import load_policy
from tests.sim.test_simulator import _app

MODEL = load_profiles("paper")
ONE = LatencyModel({"b300": GpuProfile("b300", 1, 6.5, ((1, 0.5),), 1 << 40)}, "one-slot")
O, A, I, C = EventKind.OPEN, EventKind.ACTIVE, EventKind.IDLE, EventKind.CLOSE


def _ev(*rows):
    return [SessionEvent(t, s, k, b) for t, s, k, b in rows]


@pytest.mark.parametrize("name", ["rr", "lag", "mag"])
def test_paper_baselines_pin_sessions_and_idle_state_holds_its_slot(name):
    ev = _ev((0, "a", O, 10**9), (5, "a", I, 0), (6, "b", O, 10**9), (9, "a", A, 0), (20, "a", C, 0), (30, "b", C, 0))
    cfg = SimConfig(initial_gpus=1, round_s=0)
    pinned = simulate(load_policy(name, model=ONE), ev, ONE, cfg)
    assert pinned.migrations == 0 and pinned.invalid_commands == 0
    # a stays resident while idle (no offload), resumes where it was at no restore, and its
    # slot keeps b waiting until a closes at 20; b then waits for the chunk a left running
    # (to 20.5) and runs its own: done at 21.0, needed at 6
    assert pinned.worst_resume_latency_s == pytest.approx(0.5)
    assert pinned.worst_chunk_latency_s == pytest.approx(15.0)
    offload = simulate(load_policy("least-loaded-offload", model=ONE), ev, ONE, cfg)
    assert offload.worst_chunk_latency_s < 14.5  # offloading frees a's slot for b at once


def test_paper_baselines_place_by_their_rule():
    from processors.snapshot import Gpu, Session, Snapshot
    from processors.lifecycle import SessionState

    gpus = (Gpu("g0", "b300"), Gpu("g1", "b300"), Gpu("g2", "b300"))
    sessions = (Session("x", 50 * 10**9, SessionState.SUSPENDED, "g0"),  # idle, resident: memory, no compute
                Session("y", 10**9, SessionState.EXECUTION, "g1"), Session("z", 10**9, SessionState.EXECUTION, "g1"),
                Session("w", 10**9, SessionState.EXECUTION, "g2"), Session("new", 10**9))
    snap = Snapshot(0.0, gpus, sessions)
    picks = {n: load_policy(n, model=MODEL).decide(snap, None, 1).commands[0].gpu_id for n in ("rr", "lag", "mag")}
    assert picks == {"rr": "g1", "lag": "g0", "mag": "g2"}  # next after the cursor / least compute / least memory


def test_restore_is_charged_whatever_command_places_a_resumed_session():
    ev = _ev((0, "a", O, 10**9), (5, "a", I, 0), (10, "a", A, 0), (20, "a", C, 0))
    cfg = SimConfig(initial_gpus=1, round_s=0)
    restore = 0.05 + 1e9 / 12e9
    for spec in ("tests.sim.plugin:PlaceAlways", "least-loaded-offload"):
        r = simulate(load_policy(spec), ev, MODEL, cfg)
        assert r.worst_resume_latency_s == pytest.approx(restore + 0.30), spec


def test_snapshot_shows_idle_sessions_events_and_measured_chunks():
    seen = []

    class Spy:
        name = "spy"

        def initial_state(self):
            return None

        def decide(self, snapshot, signal, state):
            seen.append(snapshot)
            return load_policy("least-loaded-offload", model=MODEL).decide(snapshot, signal, 0)

    ev = _ev((0, "a", O, 0), (0, "b", O, 0), (3, "a", I, 0), (12, "b", C, 0), (12, "a", C, 0))
    simulate(Spy(), ev, MODEL, SimConfig(initial_gpus=1, round_s=0, tick_s=5.0))
    at5 = next(s for s in seen if s.now == 5.0)
    idle = [s for s in at5.sessions if s.id == "a"]
    assert idle and idle[0].gpu_id is None and at5.now - idle[0].since == pytest.approx(2.0)  # offloaded, idle 2 s
    at3 = next(s for s in seen if s.now == 3.0)
    assert [e.kind for e in at3.events] == [I] and at3.chunks.count > 0 and at3.chunks.worst_s > 0


def test_plugin_gets_the_options_and_can_be_the_subject(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    out = tmp_path / "o.json"
    args = ["simulate", str(trace), "-p", "rr", "-p", "tests.sim.plugin:Optioned", "--subject", "optioned", "--gpu-type", "h20", "--json", str(out)]
    res = CliRunner().invoke(_app(), args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert doc["subject"] == "optioned" and set(doc["paper"]["matched_cost"]["worst_latency_reduction_pct"]) == {"rr"}
    m = doc["policies"]["optioned"]
    assert m["cost"] == pytest.approx(m["gpu_seconds"] * 1.60 / 3600)  # it booted the h20 it was offered
    assert m["worst_chunk_latency_s"] < 1.0  # started elastic: its first scale-out is ready at once
    pol = load_policy("tests.sim.plugin:Optioned", offer={"model": MODEL, "gpu_type": "h20", "boot_s": 30.0, "slo": Slo(0.01, 2.0),
                                                          "table": load_volatility_table(), "other": 1})
    assert (pol.gpu_type, pol.boot_s, pol.slo) == ("h20", 30.0, Slo(0.01, 2.0)) and pol.model is MODEL


def test_a_plugin_is_offered_the_slo_only_in_its_run_at_the_slo(tmp_path):
    """As turboserve, a plug-in's ordinary run is offered no SLO and its run at the SLO is;
    one built to read its name is the one its ordinary run uses; one that takes no SLO has
    one run, its ordinary one, for both."""
    from tests.sim import plugin

    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    plugin.BUILT.clear()
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "turboserve,tests.sim.plugin:SloRecorded", "-j", "1",
                                      "--slo-worst", "2.5"])
    assert res.exit_code == 0, res.output
    assert plugin.BUILT == [None, Slo(0.001, 2.5)]
    runner = Runner(Trace(tuple(_ev((0, "a", O, 0), (0, "a", C, 0))), "t"), MODEL, offer={"slo": Slo()})
    compare(runner, ["tests.sim.plugin:SloRecorded", "tests.sim.plugin:PlaceAlways"], "none", Slo(0.01, 2.0))
    assert plugin.BUILT[2:] == [None, Slo(0.01, 2.0)]
    assert [k[2] for k in runner.cache if k[0] == "tests.sim.plugin:PlaceAlways"] == [()]


def test_a_subject_missing_half_its_deadlines_is_flagged_in_the_json_too(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    for subject, flagged in (("bad-boots", True), ("rr", False)):  # bad-boots never places a session
        out = tmp_path / f"{subject}.json"
        res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "rr,tests.sim.plugin:BadBoots", "--subject", subject,
                                          "-j", "1", "--json", str(out)])
        assert res.exit_code == 0, res.output
        doc = json.loads(out.read_text())
        assert doc["subject_missed_half"] is flagged and (doc["policies"][subject]["deadline_miss_rate"] >= 0.5) is flagged
        assert ("missed 100% of its chunks' deadlines" in res.output) is flagged, res.output
    # a plug-in subject not given with --policy runs beside those given (it was refused: an outside run)
    out = tmp_path / "own.json"
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "rr", "--subject", "tests.sim.plugin:BadBoots",
                                      "-j", "1", "--json", str(out)])
    assert res.exit_code == 0 and json.loads(out.read_text())["subject"] == "bad-boots", res.output
    assert set(json.loads(out.read_text())["policies"]) == {"rr", "bad-boots"}


def test_the_printed_comparisons_name_what_they_compare(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    run = lambda *a: CliRunner().invoke(_app(), ["simulate", str(trace), *a])  # noqa: E731
    res = run("-p", "rr", "--subject", "turboserve")  # given, not run: refused as any other subject is
    assert res.exit_code == 2 and "subject" in res.output and "not among the policies run" in res.output
    res = run("-p", "rr,turboserve,turboserve-no-autoscale,turboserve-no-migration,oracle")
    assert res.exit_code == 0, res.output
    assert "same controller told the future" in res.output and "ablations, cost over turboserve" in res.output
    res = run("-p", "rr,turboserve-no-autoscale,oracle,tests.sim.plugin:Optioned", "--subject", "optioned", "--gpu-type", "h20")
    assert res.exit_code == 0, res.output
    assert "turboserve told the future" in res.output and "same controller" not in res.output
    assert "ran at the peak-provisioned pool" in res.output
    res = run("-p", "tests.sim.plugin:Optioned", "--gpu-type", "h20")
    assert res.exit_code == 0 and "not measured (no fixed-pool policy ran)" in res.output, res.output


def test_lag_offload_reuses_the_least_loaded_runs_only_where_they_place_alike():
    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=250, seed=3)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True))
    assert runner.twin("lag-offload") == "least-loaded-offload" and runner.twin("mag-offload") is None
    made = runner.run("least-loaded-offload", 3)
    reused = runner.run("lag-offload", 3)
    real = simulate(load_policy("lag-offload", model=MODEL), events, MODEL, SimConfig(warm_start=True, initial_gpus=3))
    assert reused.policy == real.policy == "lag-offload" and made.policy == "least-loaded-offload"
    assert reused.metrics() == real.metrics() == made.metrics()  # the run it stands for, made for real
    step = GpuProfile("b300", 4, 1.0, points=((1, 0.5), (2, 0.5), (4, 1.0)))  # a flat step: latency ties at 1 and 2
    assert Runner(Trace(events, "gen"), LatencyModel({"b300": step}), SimConfig(warm_start=True)).twin("lag-offload") is None


def test_the_example_plugin_runs_beside_the_builtins(tmp_path):
    trace, out = tmp_path / "t.csv", tmp_path / "o.json"
    write_trace(generate(GenConfig(level=5, duration_s=300.0, sessions=250, seed=3)), trace)
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "turboserve,examples.policies.target_util:TargetUtil",
                                      "--json", str(out)])
    assert res.exit_code == 0, res.output
    m = json.loads(out.read_text())["policies"]["target-util"]
    assert m["invalid_commands"] == 0 and m["chunks"] > 0 and m["scale_events"] > 0  # it grew or shrank, each command carried out
    assert m["deadline_miss_rate"] < 0.5 and m["worst_chunk_latency_s"] < 10.0  # every session served, none left waiting


def test_slo_fixed_pool_is_the_cheapest_that_meets_it():
    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=250, seed=3)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True))
    slo = Slo(0.001, 3.0)
    doc = compare(runner, ["rr", "least-loaded-offload", "turboserve"], "turboserve", slo)["slo"]
    assert set(doc["met"]) == {"rr", "least-loaded-offload", "turboserve"}
    best = doc["fixed_pool_policy"]
    assert best in ("rr", "least-loaded-offload")
    pool = doc["pool_size"][best]
    assert doc["fixed_pool_cost"] == pytest.approx(runner.run(best, pool).cost)
    if pool > 1:
        fewer = runner.run(best, pool - 1)
        assert not slo.met(fewer.deadline_miss_rate, fewer.worst_chunk_latency_s)
    assert all(doc["fixed_pool_cost"] <= doc["cost"][n] for n in doc["pool_size"] if doc["met"][n])
    # each run's own figures at the SLO say by how much it meets or misses it, and agree with met
    at_slo = runner.run(best, pool)
    assert (doc["miss_rates"][best], doc["worst_chunks_s"][best]) == (at_slo.deadline_miss_rate, at_slo.worst_chunk_latency_s)
    assert set(doc["miss_rates"]) == set(doc["worst_chunks_s"]) == set(doc["met"])
    assert all(doc["met"][n] == slo.met(doc["miss_rates"][n], doc["worst_chunks_s"][n]) for n in doc["met"])
    assert doc["oracle_miss_rate"] is None and doc["oracle_worst_s"] is None  # no oracle ran
    bound = doc["elastic_bound"]  # the fluid model's fixed pool is near the real one, and no elastic pool beats the bound
    assert 0 <= bound["elastic_gpus"] <= bound["fixed_gpus"] and abs(bound["fixed_gpus"] - pool) <= 0.25 * pool
    assert bound["saving_pct"] == pytest.approx(100 * (1 - bound["elastic_gpus"] / bound["fixed_gpus"]))
    assert bound["no_bound"] is None and bound["feasible"]


def test_the_elastic_bound_names_no_figure_under_one_gpu_or_where_no_pool_meets_the_slo():
    """Two sessions for a few minutes read a 42.5% bound, and a deadline below one session's
    chunk 97.5%, in evaluate's bars too (an outside run): the figure bounds nothing there."""
    from infra.sim.guide import miss_guide
    from infra.sim.report import _bound

    two = [SessionEvent(0.0, "u1", O), SessionEvent(0.0, "u2", O), SessionEvent(200.0, "u1", C)]
    small = _bound(miss_guide(two, MODEL["b300"], 1.0).elastic_bound(0.001, 40, 200.0))
    assert small["saving_pct"] is None and small["no_bound"].startswith("the load is under one GPU's")
    never = _bound(miss_guide(two, MODEL["b300"], 0.001).elastic_bound(0.001, 40, 200.0))
    assert never["saving_pct"] is None and never["no_bound"] == "no fixed pool meets the SLO in the fluid model"
    steady = _bound(miss_guide(_churning(300, 600.0, 4.0), MODEL["b300"], 1.0).elastic_bound(0.001, 40, 600.0))
    assert steady["no_bound"] is None and steady["saving_pct"] is not None


def test_all_runs_plugins_beside_the_builtins():
    from infra.sim.report import ALL_POLICIES
    from infra.sim_cli import _expand

    names = _expand(["all", "tests.sim.plugin:Optioned", "rr"])
    assert names[: len(ALL_POLICIES)] == list(ALL_POLICIES) and names[-1] == "tests.sim.plugin:Optioned"
    assert "infra.sim.peers:TeleFuser" in ALL_POLICIES and len(names) == len(set(names))
    assert _expand(["rr,lag, turboserve", "lag", "tests.sim.plugin:Optioned,"]) == ["rr", "lag", "turboserve", "tests.sim.plugin:Optioned"]


def test_a_stopped_run_fails_only_bounds_it_breaks_and_the_chunk_bound_holds():
    from infra.sim.report import Bound
    from infra.sim.simulator import Stop, chunk_bound

    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=250, seed=3)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True))
    full = runner.run("rr", 2)
    assert full.complete and full.chunks <= chunk_bound(events, MODEL, 0.5).after(0.0) == runner.chunk_bound.after(0.0)
    part = simulate(load_policy("rr", model=MODEL), events, MODEL, SimConfig(warm_start=True, initial_gpus=2), stop=Stop(worst_s=1.2))
    assert not part.complete and 1.2 < part.worst_chunk_latency_s <= full.worst_chunk_latency_s and part.chunks < full.chunks
    rate = full.deadline_miss_rate
    assert rate > 0
    for frac in (0.3, 0.9, 1.0):  # stopped only when the full run breaks the rate, never at its own rate
        cut = simulate(load_policy("rr", model=MODEL), events, MODEL, SimConfig(warm_start=True, initial_gpus=2),
                       stop=Stop(miss_rate=rate * frac, bound=runner.chunk_bound))
        assert cut.complete or frac < 1.0
        if not cut.complete:
            assert cut.missed_chunks > rate * frac * (cut.chunks + runner.chunk_bound.after(cut.stopped_at))
    # a search's probes stop at their first breach; the answer is the same as from full runs
    bound = Bound(full.worst_chunk_latency_s * 0.5)
    pool = runner.smallest_pool("lag", bound)
    assert any(not r.complete for r in runner.partial.values())
    assert pool is not None and bound.ok(runner.run("lag", pool)) and not bound.ok(Runner(runner.trace, MODEL, runner.config).run("lag", pool - 1))


def test_a_passing_pool_past_the_search_cap_is_no_answer():
    """A pool past the cap run for another comparison (matched cost at a large --pool) does
    not make the search bisect below it to an answer past the cap: no pool up to it is null."""
    from dataclasses import replace

    from infra.sim.report import Bound

    runner = Runner(Trace(tuple(_ev((0, "a", O, 0), (10, "a", C, 0))), "t"), MODEL, SimConfig(warm_start=True))
    cap = 8 * max(runner.peak_pool, runner.pinned_pool) + 8
    assert cap == 16
    real = runner.run("rr", 1)
    for first_ok in (cap + 4, cap):  # pools from first_ok on meet the bound, each "already run"
        runner.cache = {("rr", p, ()): replace(real, worst_chunk_latency_s=1.0 if p >= first_ok else 5.0) for p in range(1, 300)}
        runner.found.clear()  # the answers are remembered: these runs are not the last case's
        assert runner.smallest_pool("rr", Bound(1.0)) == (None if first_ok > cap else cap)
        assert runner.latency_matched_pool("rr", 1.0, hint=cap + 2) == (None if first_ok > cap else cap)
    assert runner.search_cap("rr") == cap


def test_the_matched_pool_is_the_smallest_that_meets_the_bound_where_larger_ones_fail():
    """A baseline's worst chunk near the bound goes up and down with the pool size: an outside
    run found `lag` matched at 69 GPUs where 26 met the bound (turboserve's matched-latency
    saving read +72.7% for +27.4%). Every pool below the bracket's answer is checked."""
    from infra.sim.report import Bound

    runner = Runner(Trace(tuple(_ev((0, "a", O, 0), (10, "a", C, 0))), "t"), MODEL, SimConfig(warm_start=True))
    checked: list[int] = []

    def check(spec: str, pool: int, bound: Bound) -> bool:  # the runs' outcomes, none made yet
        checked.append(pool)
        return pool == 3 or pool >= 12

    runner.check = check  # type: ignore[method-assign]
    assert runner.latency_matched_pool("rr", 1.0, hint=12) == 3
    assert 12 in checked and checked[-1] == 3  # bracketed at 12, then 1, 2, 3 checked


def test_the_miss_guide_falls_with_the_pool_and_aims_where_it_says():
    from infra.sim.guide import miss_guide

    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=400, seed=2)))
    guide = miss_guide(events, MODEL["b300"], 1.0)
    rates = [guide.rate(p) for p in range(1, 40)]
    assert rates[0] > 0 and all(a >= b for a, b in zip(rates, rates[1:])) and rates[-1] < rates[0]
    for target in (0.05, 0.01, 0.001):
        p = guide.pool_for(target, 60)
        assert guide.rate(p) <= target and (p == 1 or guide.rate(p - 1) > target)
        x = guide.pool_at(target, 60)  # the same place as a real number
        assert p - 1 <= x <= p and guide.rate(x) == pytest.approx(target, rel=0.02)
    assert guide.pool_for(0.0, 7) == 7 and guide.pool_at(0.0, 7) == 7.0  # none within the cap: the cap
    assert guide.pool_at(1.0, 7) == 1.0


def _churning(sessions: int, until: float, per_s: float) -> list[SessionEvent]:
    """``sessions`` open at 0, each pausing for 0.5 s in turn (``per_s`` returns a second)
    and closing at ``until``."""
    rows = [(0.0, f"s{i}", O, 0) for i in range(sessions)]
    for k in range(int((until - 1.5) * per_s)):
        t = 1.0 + k / per_s
        rows += [(t, f"s{k % sessions}", I, 0), (t + 0.5, f"s{k % sessions}", A, 0)]
    rows += [(until, f"s{i}", C, 0) for i in range(sessions)]
    return sorted(_ev(*rows), key=lambda e: e.t)


def test_the_elastic_bound_saves_nothing_on_a_steady_load_and_the_idle_share_of_a_run():
    from infra.sim.guide import miss_guide

    steady = miss_guide(_churning(300, 600.0, 4.0), MODEL["b300"], 1.0)
    b = steady.elastic_bound(0.001, 40, 600.0)
    # the fixed pool meets the rate in the model, one a tenth smaller does not
    assert steady.rate(b.fixed_gpus) <= 0.001 * 1.01 and steady.rate(0.9 * b.fixed_gpus) > 0.001
    assert 0 <= b.saving_pct < 3.0  # nothing to follow: at most the spread of the returns per span
    # the same load for half the run and nothing after: a pool that follows it saves half, and no more
    half = miss_guide(_churning(300, 600.0, 4.0), MODEL["b300"], 1.0).elastic_bound(0.001, 40, 1200.0)
    assert half.fixed_gpus == pytest.approx(b.fixed_gpus, rel=0.02)
    assert 50.0 - 0.2 <= half.saving_pct <= 50.0 + 0.5
    # with no miss allowed each first chunk must land at the knee: the smallest such pool
    strict = steady.elastic_bound(0.0, 40, 600.0)
    assert steady.rate(strict.fixed_gpus) == 0 and steady.rate(0.99 * strict.fixed_gpus) > 0
    assert strict.fixed_gpus > b.fixed_gpus and strict.elastic_gpus <= strict.fixed_gpus
    # 400 sessions for the first 10 s of a minute: the elastic pool needs them for one span of
    # six, from one session's share of a GPU up (none charged for the instant they close)
    burst = [SessionEvent(0.0, f"s{i}", O) for i in range(400)] + [SessionEvent(10.0, f"s{i}", C) for i in range(400)]
    short = miss_guide(burst, MODEL["b300"], 1.0).elastic_bound(0.001, 40, 60.0)
    assert 100 * 5 / 6 - 0.3 <= short.saving_pct <= 100 * 5 / 6 + 0.01
    lone = miss_guide([burst[0], burst[400]], MODEL["b300"], 1.0).elastic_bound(0.001, 40, 20.0)
    # one session for half a run: a pool small enough that its first chunk waits out 11 others misses
    assert 1 / 12 <= lone.fixed_gpus <= 1 / 10 and lone.saving_pct == pytest.approx(50.0, abs=0.5)
    # a session that runs back to back never misses up to K: the pool holds every session at K at least
    calm = miss_guide(_churning(400, 600.0, 0.0), MODEL["b300"], 1.0).elastic_bound(0.001, 40, 600.0)
    assert calm.elastic_gpus == pytest.approx(400 / 40, rel=0.01) and calm.fixed_gpus >= 400 / 40


def test_an_slo_search_reads_a_failing_run_where_the_bounds_stop_would_end_it():
    """The aim after a failing probe is the same whether that pool was stopped at the SLO's
    breach, run to the end, or stopped later at another bound: each is read at its last
    window start before the breach."""
    from infra.sim.report import Bound

    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=300, seed=5)))
    bound = Bound(3.0, 0.002)
    full, stopped, later = (Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True, window_s=10.0)) for _ in (1, 2, 3))
    # the smallest pool that fails after a window with misses (smaller ones break at once)
    pool = next(p for p in range(1, 20) if not stopped.check("least-loaded-offload", p, bound)
                and stopped.partial[("least-loaded-offload", p, ())].samples[-1][2] > 0)
    res = full.run("least-loaded-offload", pool)
    part = stopped.partial[("least-loaded-offload", pool, ())]
    assert not part.complete and part.samples == res.samples[: len(part.samples)] and 0 < len(part.samples) < len(res.samples)
    later.run("least-loaded-offload", pool, stop=later._stop(Bound(3.0, 1.5 * bound.miss_rate)))  # a looser bound's stop
    assert not later.check("least-loaded-offload", pool, bound)
    aims = {r._slo_aim("least-loaded-offload", pool, bound, bound.miss_rate, 50) for r in (full, stopped, later)}
    assert len(aims) == 1 and None not in aims


def test_a_latency_search_aims_by_the_load_its_worst_chunk_implies():
    """l(n - 1) + l(n) inverted on the GPU type's curve; a run at one pool aims at the pool
    that brings n to the bound's (n x pool kept); the answer still passes where the pool
    below it does not."""
    from infra.sim.report import Bound

    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=300, seed=6)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True))
    p = MODEL["b300"]
    for n in (1, 2, 7, p.capacity, 2 * p.capacity):
        assert runner._load_at(p.latency(n - 1) + p.latency(n)) == pytest.approx(n)
    assert runner._load_at(0.0) == 1.0
    ref = runner.run("least-loaded-offload", 4)
    have = runner._load_at(ref.worst_chunk_latency_s)
    bound = Bound(p.latency(9) + p.latency(10))
    assert runner._aim("least-loaded-offload", bound, None) == math.ceil(have * 4 / 10 - 1e-9)
    assert runner._aim("rr", bound, None) is None  # no full run of rr to aim by
    pool = runner.smallest_pool("least-loaded-offload", bound)
    assert pool is not None and bound.ok(runner.run("least-loaded-offload", pool))
    assert pool == 1 or not bound.ok(Runner(runner.trace, MODEL, runner.config).run("least-loaded-offload", pool - 1))


def test_an_slo_search_finds_the_smallest_passing_pool_whatever_runs_came_before():
    """The SLO search's probes depend on nothing but its own outcomes: a runner that made
    other runs first (other searches, stopped at other bounds) gives the same answer from
    the same probes, and that answer is the smallest pool that passes."""
    from infra.sim.report import Bound

    events = tuple(generate(GenConfig(level=5, duration_s=300.0, sessions=300, seed=5)))
    bound = Bound(3.0, 0.001)
    fresh, used = (Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True)) for _ in (1, 2))
    for p in (2, 3, 5):
        used.run("mag-offload", p)
    used.smallest_pool("mag-offload", Bound(fresh.run("turboserve").worst_chunk_latency_s))
    pool = fresh.slo_pool("mag-offload", bound)
    assert pool is not None and used.slo_pool("mag-offload", bound) == pool
    probed = {k for k in (*fresh.cache, *fresh.partial) if k[0] == "mag-offload"}
    assert probed <= {k for k in (*used.cache, *used.partial) if k[0] == "mag-offload"}
    assert bound.ok(fresh.run("mag-offload", pool)) and (pool == 1 or not bound.ok(Runner(fresh.trace, MODEL, fresh.config).run("mag-offload", pool - 1)))


def test_parallel_comparison_makes_the_same_figures_from_the_same_runs():
    """Two processes make exactly the runs one makes (each group of policies in its own
    task): same figures, and not one run more or less."""
    events = tuple(generate(GenConfig(level=5, duration_s=240.0, sessions=200, seed=4)))
    names = ["rr", "lag", "least-loaded-offload", "turboserve", "turboserve-no-migration", "turboserve-no-autoscale",
             "oracle", "oracle-autoscale"]
    runners = [Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True)) for _ in (1, 2)]
    docs = [compare(r, names, "turboserve", Slo(), jobs=j) for r, j in zip(runners, (1, 2))]
    assert json.dumps(docs[0], sort_keys=True, default=str) == json.dumps(docs[1], sort_keys=True, default=str)
    assert set(runners[0].cache) == set(runners[1].cache) and set(runners[0].partial) == set(runners[1].partial)
    assert any(k[2] for k in runners[1].cache)  # the SLO runs (the subject's own in a task of its own) are among them


def test_a_task_in_a_reused_worker_starts_from_the_runs_made_before_the_fork():
    """A worker process runs several tasks; each starts from the runs made before the fork,
    not from its previous task's (a search starts from the runs already made: the pinned
    pools' latency searches after their own SLO searches found other pools)."""
    from infra.sim import report

    events = tuple(generate(GenConfig(level=5, duration_s=240.0, sessions=200, seed=4)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True))
    runner.run("turboserve")
    report._SHARED, report._BASE = runner, (dict(runner.cache), dict(runner.partial), dict(runner.found))
    try:
        task = (("compare", ["rr", "lag", "mag"]), "turboserve", Slo(), None)
        first = report._part(task)
        report._part((("slo", ["rr", "lag", "mag"]), "turboserve", Slo(), None))
        again = report._part(task)
    finally:
        report._SHARED = report._BASE = None
    assert again[2] == first[2] and set(again[0]) == set(first[0]) and set(again[1]) == set(first[1])
    assert any(k[0] == "pool" for k in first[2])  # the latency searches were made


def test_a_plugins_bug_or_clashing_name_is_one_line_naming_it(tmp_path, monkeypatch):
    """A plug-in that raises, answers with something that is not a Decision, or is named as
    a built-in (it would replace that one's row) is refused in one line; the no-autoscale
    ablation run without turboserve as the subject runs a fixed pool, not none."""
    monkeypatch.syspath_prepend(str(tmp_path))
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    for plugin, said in (("Raises", "policy 'raises': decide at t=0.0 s raised ValueError: a bug in the plug-in"),
                         ("ListNotDecision", "decide at t=0.0 s returned list, not a Decision"),
                         ("NamedRr", "its name 'rr' is a built-in policy's too"), ("Nowhere", "has no 'Nowhere'"),
                         ("NamedAll", "its name 'all' is the word for every policy's too"),
                         ("NamedCased", "its name 'TurboServe' is the built-in 'turboserve' but for its case"),
                         ("NamedOracleSpaced", "its name 'oracle ' has spaces around it")):
        res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "rr", "-p", f"tests.sim.plugin:{plugin}", "-j", "1"])
        assert res.exit_code != 0 and said in res.output and "Traceback" not in res.output, (plugin, res.output)
        if plugin == "Raises":  # the run's progress bar leaves no blank line before it
            assert res.output.startswith("error: policy 'raises'"), res.output
    (tmp_path / "broken_plugin.py").write_text("def x(:\n")  # a syntax error: one line too
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "broken_plugin:P", "-j", "1"])
    assert res.exit_code == 2 and "cannot import 'broken_plugin' (SyntaxError" in res.output, res.output
    # a module that exits on import ended the command with its code and no word; a class that is
    # no policy read as its constructor's bad options
    (tmp_path / "exiting_plugin.py").write_text("import sys\nsys.exit(3)\n")
    for spec, said in (("exiting_plugin:P", "cannot import 'exiting_plugin' (it called sys.exit(3) on import)"),
                       ("processors.decisions:Boot", "Boot is not a policy: it needs name, initial_state() and decide(")):
        res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", spec, "-j", "1"])
        assert res.exit_code == 2 and said in res.output, (spec, res.output)
    out = tmp_path / "bad.json"  # Boots the simulator cannot carry out are counted, not run (nor a hang)
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "tests.sim.plugin:BadBoots", "-j", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["policies"]["bad-boots"]["invalid_commands"] == 3
    # a policy too slow to decide live is named under the table (it printed nothing: an outside run)
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "tests.sim.plugin:Sleepy", "-j", "1", "--json", str(out)])
    assert res.exit_code == 0 and "sleepy: decisions of up to 5" in res.output and "round every 0.5 s" in res.output, res.output
    took = json.loads(out.read_text())["decide_s"]["sleepy"]
    assert took["max"] >= 0.5 and took["calls"] > 1 and took["mean"] < took["max"]
    out = tmp_path / "peer.json"  # the peer by the name its row has
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "telefuser,kubernetes-hpa,ray-serve", "-j", "1", "--json", str(out)])
    assert res.exit_code == 0 and set(json.loads(out.read_text())["policies"]) == {"telefuser", "kubernetes-hpa", "ray-serve"}, res.output
    out = tmp_path / "o.json"
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "turboserve-no-autoscale", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["policies"]["turboserve-no-autoscale"]["gpu_seconds"] > 0


def test_no_fixed_pool_as_fast_as_the_subject_is_null_not_the_search_cap(tmp_path):
    """mag places by memory; with no state sizes every session lands on the first GPU with
    room, so no pool size reaches turboserve's worst chunk: matched latency says so (null),
    instead of the pool at the search's cap."""
    rows = ["t_s,session_id,event"] + [f"0,s{i},{e}" for e in ("open", "active") for i in range(60)]
    trace = tmp_path / "packed.csv"
    trace.write_text("\n".join(rows + [f"60,s{i},close" for i in range(60)]) + "\n")
    out = tmp_path / "o.json"
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "turboserve,rr,lag,mag", "-j", "1", "--json", str(out)])
    assert res.exit_code == 0 and "no pool up to the search's cap is as fast" in res.output, res.output
    doc = json.loads(out.read_text())
    assert doc["matched_latency"]["pool_size"]["mag"] is None and doc["paper"]["matched_latency"]["cost_reduction_pct"]["mag"] is None
    assert isinstance(doc["matched_latency"]["pool_size"]["lag"], int)
    from infra.sim.evaluate import bars

    won = json.loads(out.read_text())
    won["paper"]["matched_latency"]["cost_reduction_pct"]["mag"] = 1.0  # null reads as no fixed pool this fast: a win
    assert bars(doc)["beats_paper_baselines"] == bars(won)["beats_paper_baselines"]


@pytest.mark.parametrize("cost_pct, latency_pct, beats", [(5.0, 2.0, True), (5.0, None, True), (5.0, -1.0, False),
                                                          (-0.1, 9.0, False), (0.0, 9.0, False)])
def test_the_strongest_fixed_pool_is_beaten_only_in_both_comparisons(cost_pct, latency_pct, beats):
    from infra.sim.evaluate import _beats

    doc = {"matched_cost": {"worst_latency_reduction_pct": {"least-loaded-offload": cost_pct}},
           "matched_latency": {"cost_reduction_pct": {"least-loaded-offload": latency_pct}}}
    assert _beats(doc, "least-loaded-offload") is beats
    assert _beats(doc, "lag-offload") is None  # not run: no verdict


def test_evaluate_compares_a_plugin_beside_the_split():
    """A plug-in given to evaluate runs on every trace and has its own entry in the bars."""
    from infra.sim.evaluate import TraceSpec, evaluate
    from processors.autoscaler import AutoscalerConfig

    vt, auto = load_volatility_table(), AutoscalerConfig()
    seen = []
    out = evaluate([TraceSpec("calm", 0, 60.0, 30)], load_profiles("paper"), SimConfig(warm_start=True),
                   {"turboserve": {"table": vt, "autoscaler": auto}}, {"table": vt, "autoscaler": auto},
                   policies=("rr", "lag", "mag", "turboserve", "tests.sim.plugin:Optioned"), jobs=1, on_runner=seen.append)
    (doc,) = out.values()
    mine = doc["bars"]["peers"]["optioned"]
    run = doc["comparison"]["policies"]["optioned"]
    assert len(seen) == 1 and mine["cost"] == run["cost"] > 0 and mine["worst_s"] == run["worst_chunk_latency_s"]
    assert "telefuser" not in doc["bars"] and set(doc["bars"]["peers"]) == {"optioned"}
    assert mine["invalid_commands"] == run["invalid_commands"]  # a peer's refused commands are not hidden in its bars


def test_evaluate_makes_a_plugin_the_subject_and_turboserve_a_peer():
    """With a subject, the bars are its own and turboserve stands beside it as a plug-in
    does; the ablations, turboserve's, are not compared."""
    from infra.sim.evaluate import TraceSpec, evaluate
    from processors.autoscaler import AutoscalerConfig

    vt, auto = load_volatility_table(), AutoscalerConfig()
    out = evaluate([TraceSpec("calm", 0, 60.0, 30)], MODEL, SimConfig(warm_start=True),
                   {"turboserve": {"table": vt, "autoscaler": auto}}, {"table": vt, "autoscaler": auto},
                   policies=("rr", "lag", "mag", "turboserve", "turboserve-no-autoscale", "tests.sim.plugin:Optioned"),
                   jobs=1, subject="tests.sim.plugin:Optioned")
    (doc,) = out.values()
    b, c = doc["bars"], doc["comparison"]
    assert c["subject"] == "optioned" and c["ablation_cost_increase_pct"] is None and b["ablations_cost_more"] is None
    assert set(b["peers"]) == {"turboserve"} and b["peers"]["turboserve"]["cost"] == c["policies"]["turboserve"]["cost"]
    assert b["slo_met"] == c["slo"]["met"]["optioned"] and b["resume"]["optioned"]["worst_s"] == c["policies"]["optioned"]["worst_resume_latency_s"]


def test_evaluate_subject_gives_the_comparison_simulate_subject_gives(tmp_path):
    """``evaluate --subject NAME`` resolves the subject as ``simulate --subject`` does (a
    plug-in by its name), and its comparison is simulate's for the same policies; a subject
    not run is refused in one line."""
    from infra.sim.evaluate import EVAL_POLICIES

    path = tmp_path / "mine.csv"
    write_trace(generate(GenConfig(level=5, duration_s=60.0, sessions=30, seed=3)), path)
    mine = "examples.policies.target_util:TargetUtil"
    ev, sim = tmp_path / "ev.json", tmp_path / "sim.json"
    res = CliRunner().invoke(_app(), ["evaluate", "--trace", str(path), "-p", mine, "--subject", "target-util", "-j", "1", "--json", str(ev)])
    assert res.exit_code == 0, res.output
    assert "target-util cost" in res.output and "ablations are compared only when turboserve is the subject" in res.output
    got = json.loads(ev.read_text())[str(path)]
    args = ["simulate", str(path), "-p", ",".join([*EVAL_POLICIES, mine]), "--subject", "target-util", "-j", "1", "--json", str(sim)]
    assert CliRunner().invoke(_app(), args).exit_code == 0
    want = {k: v for k, v in json.loads(sim.read_text()).items() if k not in ("wall_s", "decide_s")}  # host times
    assert want["subject"] == "target-util" and got["comparison"] == want
    assert got["bars"]["slo_met"] == want["slo"]["met"]["target-util"] and "target-util" not in got["bars"]["peers"]
    assert set(got["bars"]["peers"]) == {"turboserve", "telefuser"}
    bad = CliRunner().invoke(_app(), ["evaluate", "--trace", str(path), "--subject", "nobody", "-j", "1"])
    assert bad.exit_code == 2 and "subject: not among the policies run (rr, lag" in bad.output, bad.output
    said = [line for line in bad.output.strip().splitlines() if not line.startswith("evaluate: ")]  # (progress: no terminal here)
    assert len(said) == 1 and "lag-offload" not in bad.output, bad.output  # not run here


def test_evaluate_names_a_subject_that_missed_half_its_deadlines_under_its_table(tmp_path):
    """``simulate`` flagged such a subject; ``evaluate`` printed its bars (winning, against
    pools as slow as it is) with no word of it (an outside run)."""
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    out = tmp_path / "ev.json"
    res = CliRunner().invoke(_app(), ["evaluate", "--trace", str(trace), "-p", "tests.sim.plugin:OnlyBadBoots",
                                      "--subject", "only-bad-boots", "-j", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())[str(trace)]
    assert doc["comparison"]["subject_missed_half"] is True
    said = " ".join(res.output.split())
    assert f"only-bad-boots missed half its chunks' deadlines or more on 1 trace(s) ({trace})" in said
    # nor is it within 10% of the oracle, whatever it saved by not serving (it read true)
    assert doc["comparison"]["paper"]["oracle_gap_pct"] <= 10.0 and doc["bars"]["oracle_gap_le_10"] is False
    # the subject's commands the simulator could not carry out, named as a peer's are (it said nothing)
    assert f"only-bad-boots: commands the simulator could not carry out on 1 trace(s) ({trace} 3;" in said


def test_a_plugin_name_with_a_control_character_is_refused(tmp_path):
    """A name with a newline split the table's row and the SLO line in two (an outside run)."""
    trace = tmp_path / "t.csv"
    trace.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n30,a,close,\n")
    res = CliRunner().invoke(_app(), ["simulate", str(trace), "-p", "tests.sim.plugin:NamedTwoLines", "-j", "1"])
    assert res.exit_code == 2 and "control character" in res.output and "Traceback" not in res.output, res.output


def test_the_plugin_pool_starts_the_users_plugins_not_the_shipped_peer():
    """``--pool N`` starts the user's own plug-ins with N GPUs; TeleFuser's port, a
    reference beside turboserve, keeps its elastic start whatever the user's pool."""
    events = tuple(generate(GenConfig(level=5, duration_s=60.0, sessions=40, seed=1)))
    runner = Runner(Trace(events, "gen"), MODEL, SimConfig(warm_start=True), plugin_pool=6)
    assert runner._key("infra.sim.peers:TeleFuser", None, {})[1] == runner.elastic_start
    assert runner._key("tests.sim.plugin:Optioned", None, {})[1] == 6


def test_evaluate_takes_a_users_own_traces_with_the_splits_bars(tmp_path):
    """``evaluate --trace`` runs a user's file through the split's policies and bars, keyed by its path;
    a file given twice, beside a split or with --only, is refused in one line before any run."""
    from infra.sim.evaluate import bars, evaluate
    from processors.autoscaler import AutoscalerConfig
    from infra.sim.trace import load_trace

    path = tmp_path / "mine.csv"
    write_trace(generate(GenConfig(level=5, duration_s=60.0, sessions=30, seed=3)), path)
    out = tmp_path / "ev.json"
    res = CliRunner().invoke(_app(), ["evaluate", "--trace", str(path), "-j", "1", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert list(doc) == [str(path)] and "given traces" in res.output
    vt, auto = load_volatility_table(), AutoscalerConfig()
    same = evaluate([load_trace(path)], MODEL, SimConfig(warm_start=True), {"turboserve": {"table": vt, "autoscaler": auto}},
                    {"table": vt, "autoscaler": auto}, jobs=1)[str(path)]
    assert set(doc[str(path)]["comparison"]["policies"]) == set(same["comparison"]["policies"]) >= {"turboserve", "rr", "telefuser"}
    assert doc[str(path)]["bars"] == bars(doc[str(path)]["comparison"])
    # the resume latency no bar sees, beside them (turboserve's, and the fixed pools')
    ts = doc[str(path)]["comparison"]["policies"]["turboserve"]
    assert doc[str(path)]["bars"]["resume"]["turboserve"] == {"worst_s": ts["worst_resume_latency_s"],
                                                               "p99_s": ts["p99_resume_latency_s"]}
    assert doc[str(path)]["comparison"]["policies"]["turboserve"]["cost"] == same["comparison"]["policies"]["turboserve"]["cost"]
    # the world options are simulate's: the same run on another GPU type and boot time
    world = ["--gpu-type", "h20", "--boot", "30", "--deadline", "1.2"]
    sim, ev = tmp_path / "sim.json", tmp_path / "ev2.json"
    assert CliRunner().invoke(_app(), ["simulate", str(path), "-p", "turboserve,rr", "-j", "1", "--json", str(sim), *world]).exit_code == 0
    assert CliRunner().invoke(_app(), ["evaluate", "--trace", str(path), "-j", "1", "--json", str(ev), *world]).exit_code == 0
    on_h20 = json.loads(ev.read_text())[str(path)]["comparison"]["policies"]["turboserve"]
    assert on_h20 == json.loads(sim.read_text())["policies"]["turboserve"]
    assert on_h20["cost"] != doc[str(path)]["comparison"]["policies"]["turboserve"]["cost"]
    for args, said in ((["--trace", str(path), "--trace", str(path)], "given twice"),
                       (["--trace", str(path), "--gpu-type", "a100"], "no such GPU type"),
                       (["--trace", str(path), "--split", "tune"], "not both"),
                       (["--trace", str(path), "--only", "calm/s0"], "--only"),
                       (["--trace", str(tmp_path / "none.csv")], "cannot read")):
        bad = CliRunner().invoke(_app(), ["evaluate", *args])
        assert bad.exit_code == 2 and said in bad.output and "Traceback" not in bad.output, (args, bad.output)


def test_the_hour_split_is_one_hour_from_each_of_the_six_models():
    """``--split hour``: 13 one-hour traces (every other split's are 20 minutes) from all six
    workload models at seed 4, at their 20-minute traces' arrival rates."""
    from typer.testing import CliRunner

    from infra.cli import app
    from infra.sim.evaluate import HOUR, make_trace
    from infra.sim.families import FAMILIES
    from infra.sim.launches import LAUNCHES
    from infra.sim.outside import OUTSIDE
    from infra.sim.review import REVIEW
    from infra.sim.surges import SURGES

    assert len(HOUR) == 13 and {s.seed for s in HOUR} == {4} and {s.duration_s for s in HOUR} == {3600.0}
    fams = {s.family for s in HOUR}
    assert "gen-10" in fams and all(fams & set(m) for m in (FAMILIES, LAUNCHES, OUTSIDE, REVIEW, SURGES))
    calm = make_trace(next(s for s in HOUR if s.family == "calm"))
    assert 3500 <= calm.events[-1].t <= 3600
    only = CliRunner().invoke(app, ["evaluate", "--split", "hour", "--only", "calm/s0"])
    assert only.exit_code == 2 and "calm/s4" in only.output  # the split's seed is named


def test_a_plugin_that_raises_stops_the_run_before_the_other_policies_run(tmp_path):
    """Its own run comes first: the one-line error came after every other run (22.7 s of them
    in an outside run) and threw their results away."""
    from infra.sim.trace import load_trace
    from processors.latency import load_profiles
    from schemas.errors import PolicyError

    made: list[str] = []
    path = tmp_path / "t.csv"
    path.write_text("t_s,session_id,event,state_mb\n0,a,open,10\n0,b,open,10\n30,a,close,\n40,b,close,\n")
    runner = Runner(load_trace(path), load_profiles("paper"), on_run=made.append)
    with pytest.raises(PolicyError, match="policy 'raises': decide at t=0.0 s raised ValueError"):
        compare(runner, ["rr", "turboserve", "tests.sim.plugin:Raises"])
    assert [m.split(" (")[0] for m in made] == ["tests.sim.plugin:Raises"], made  # no other run made


def test_evaluate_on_a_trace_that_lasts_no_time_prints_its_row_and_writes_its_json(tmp_path):
    """A trace whose last row is at 0 s has no fixed pool to save against (its saving is
    null): the table crashed on it after every run, and no trace's JSON was written (an
    outside run)."""
    path, good = tmp_path / "one-row.csv", tmp_path / "good.csv"
    path.write_text("t_s,session_id,event,state_mb\n0,u1,open,2000\n")
    write_trace(generate(GenConfig(level=5, duration_s=60.0, sessions=20, seed=4)), good)
    out = tmp_path / "ev.json"
    res = CliRunner().invoke(_app(), ["evaluate", "--trace", str(good), "--trace", str(path), "-j", "1",
                                      "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    assert set(doc) == {str(good), str(path)} and doc[str(path)]["bars"]["slo_saving_pct"] is None
    # stderr is no terminal here: a line per trace says how far it is (a log had nothing for minutes)
    assert f"evaluate: {good} (1 of 2)" in res.output and f"evaluate: {path} (2 of 2)" in res.output
    # the subject's share of chunks past their deadline, beside its cost and worst chunk
    ts = doc[str(good)]["comparison"]["policies"]["turboserve"]
    assert "deadline misses %" in res.output and f"/ {100 * ts['deadline_miss_rate']:.2f}" in res.output


@pytest.mark.parametrize("met, saving", [(True, 25.0), (False, None)])
def test_a_cost_that_misses_the_slo_saves_nothing(met, saving):
    """An outside run read a 28% saving on a trace whose SLO turboserve missed: the saving is
    null there, as the printed table says "misses SLO"."""
    from infra.sim.evaluate import bars

    none = {"rr": 1.0, "lag": 1.0, "mag": 1.0}
    doc = {"subject": "turboserve", "paper": {"matched_cost": {"worst_latency_reduction_pct": none},
                     "matched_latency": {"cost_reduction_pct": none}, "oracle_gap_pct": 0.0},
           "slo": {"fixed_pool_cost": 100.0, "cost": {"turboserve": 75.0}, "met": {"turboserve": met},
                   "elastic_bound": {"saving_pct": 30.0}},
           "policies": {}}
    got = bars(doc)
    assert got["slo_saving_pct"] == saving and got["slo_20pct_cheaper"] is met and got["slo_met"] is met


def test_simulate_writes_its_json_before_a_reader_that_stops_early(tmp_path):
    """`simulate ... --json OUT | head -1` wrote no JSON (the table's print failed first, on the
    closed pipe); the results come first, as `evaluate`'s do."""
    import subprocess
    import sys

    rows = ["t_s,session_id,event"] + [f"{i},s{i},open" for i in range(6)] + [f"{30 + i},s{i},close" for i in range(6)]
    trace = tmp_path / "t.csv"
    trace.write_text("\n".join(rows) + "\n")
    out = tmp_path / "o.json"
    done = subprocess.run(f"{sys.executable} -m infra simulate {trace} -p turboserve,rr -j 1 --json {out} | head -c 1",
                          shell=True, capture_output=True, text=True, timeout=300)
    assert out.exists(), done.stderr
    assert "turboserve" in json.loads(out.read_text())["policies"]
