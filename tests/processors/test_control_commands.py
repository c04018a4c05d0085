"""The control agent's pure parts: commands -> records, capacity fitting, one decision round."""

from __future__ import annotations

from processors import decisions as d
from processors.agents.control import ControlShell
from processors.agents.control_config import ControlConfig, fit_capacity, make_policy
from processors.agents.control_records import command_records
from processors.cluster import BOOTING_PREFIX, ClusterView, apply_all, to_snapshot
from processors.latency import load_profiles
from schemas import records as r

G = r.Generation


def _view() -> ClusterView:
    return apply_all(ClusterView(), [
        r.WorkerProvisioned(worker_id="p-0", ts=0.5, provisioner="provisioner-p", pool="p"),
        r.WorkerProvisioned(worker_id="p-1", ts=0.5, provisioner="provisioner-p", pool="p"),
        r.WorkerUp(worker_id="p-0", ts=1, capacity=4, pool="p"),
        r.WorkerUp(worker_id="p-1", ts=1, capacity=4, pool="p"),
        r.SessionOpened(session_id="a", ts=1),
        r.Claimed(worker_id="p-0", session_id="a", generation=G("p-0", 3), ts=2),
        r.SessionOpened(session_id="b", ts=1),
    ])


def test_migrate_becomes_a_handoff_stamped_with_the_current_generation():
    (rec,) = command_records([d.Migrate("a", "p-0", "p-1", gamma=0.1, cost_s=0.02, reason="drain")],
                             _view(), 10.0)
    assert rec == r.Handoff(worker_id="p-0", session_id="a", generation=G("p-0", 3),
                            target_worker="p-1", ts=10.0, reason="drain")


def test_migrations_the_view_cannot_stamp_are_dropped():
    cmds = [d.Migrate("a", "p-1", "p-0", 0.1, 0.0),           # the view says a is on p-0
            d.Migrate("b", "p-0", "p-1", 0.1, 0.0),           # b has no generation yet
            d.Migrate("a", "p-0", BOOTING_PREFIX + "p:0", 0.1, 0.0)]  # target not up yet
    assert command_records(cmds, _view(), 10.0) == ()


def test_scale_commands_go_to_the_pool_and_session_commands_are_the_dispatchs():
    cmds = [d.Place("b", "p-1"), d.Restore("b", "p-1"), d.Offload("a", "p-0"), d.Discard("a", "p-0"),
            d.Boot(2, "cpu"), d.Vacate("p-1"), d.Retire("p-1"), d.Vacate(BOOTING_PREFIX + "p:0")]
    recs = command_records(cmds, _view(), 10.0, pool="p", decision_id="x")
    assert recs == (
        r.ScaleOut(pool="p", count=2, ts=10.0, gpu_type="cpu", decision_id="x"),
        r.Drain(pool="p", worker_id="p-1", ts=10.0, decision_id="x"),
        r.Shutdown(pool="p", worker_id="p-1", ts=10.0, decision_id="x"),
    )
    assert not any(isinstance(x, r.Assign) for x in recs)


def test_a_decisions_boots_are_one_scale_out_per_gpu_type():
    """The autoscaler's Boot and the pool floor's Boot in one decision: one ScaleOut of their
    sum (the provisioner carries out a decision id once per GPU type: two records of one id
    had the second refused as a replay, found by an outside run after `up` restarted)."""
    cmds = [d.Boot(1, "cpu"), d.Vacate("p-1"), d.Boot(1, "cpu"), d.Boot(2, "gpu")]
    recs = command_records(cmds, _view(), 10.0, pool="p", decision_id="x")
    assert recs == (
        r.ScaleOut(pool="p", count=2, ts=10.0, gpu_type="cpu", decision_id="x"),
        r.Drain(pool="p", worker_id="p-1", ts=10.0, decision_id="x"),
        r.ScaleOut(pool="p", count=2, ts=10.0, gpu_type="gpu", decision_id="x"),
    )
    # a sum past what a provisioner takes asks for that much (past it, it took none: 20 + 20
    # went from 20 workers, the first Boot's, to none); the next decision asks for the rest
    big = command_records([d.Boot(20, "cpu"), d.Boot(20, "cpu"), d.Boot(40, "gpu")], _view(), 10.0, pool="p")
    assert [(x.gpu_type, x.count) for x in big] == [("cpu", r.SCALE_OUT_MAX), ("gpu", r.SCALE_OUT_MAX)]


def test_a_reinstate_goes_to_the_workers_pool_but_not_after_its_shutdown():
    view = apply_all(_view(), [r.Drain(pool="p", worker_id="p-1", ts=9.0)])
    assert command_records([d.Reinstate("p-1"), d.Reinstate(BOOTING_PREFIX + "p:0")], view, 10.0, pool="q", decision_id="x") == (
        r.Reinstate(pool="p", worker_id="p-1", ts=10.0, decision_id="x"),)
    stopping = apply_all(view, [r.Shutdown(pool="p", worker_id="p-1", ts=9.5)])
    assert command_records([d.Reinstate("p-1")], stopping, 10.0) == ()  # its provisioner stops it once empty


def test_a_shutdown_is_not_repeated_within_the_resend_interval():
    view = apply_all(_view(), [r.Shutdown(pool="p", worker_id="p-1", ts=9.0)])
    assert command_records([d.Retire("p-1")], view, 12.0, shutdown_resend_s=10) == ()
    assert len(command_records([d.Retire("p-1")], view, 20.0, shutdown_resend_s=10)) == 1


def test_fit_capacity_uses_the_workers_k():
    model = load_profiles("reference-cpu")
    fitted = fit_capacity(model, _view())
    assert fitted["cpu"].capacity == 4 and fitted["cpu"].cost_per_hour == model["cpu"].cost_per_hour
    assert fit_capacity(model, ClusterView()) is model


def test_a_round_scales_out_when_sessions_outgrow_the_pool_and_remembers_it():
    shell = ControlShell(ControlConfig(dwell_s=30.0), clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="p-0", ts=1, capacity=2, pool="default"))
    shell.fold(r.Heartbeat(worker_id="p-0", ts=99, sessions=6, executing=6, capacity=2))
    for i in range(6):
        shell.fold(r.SessionOpened(session_id=f"s{i}", ts=90.0 + i))
        shell.fold(r.Claimed(worker_id="p-0", session_id=f"s{i}", generation=G("p-0", 1), ts=99.0))
    assert shell.due(100.0)
    out = shell.decide(100.0)
    (scale,) = [x for x in out if isinstance(x, r.ScaleOut)]
    assert scale.pool == "default" and scale.count >= 2 and scale.gpu_type == "cpu"
    (decision,) = [x for x in out if isinstance(x, r.ScalingDecision)]
    assert decision.target == 1 + scale.count and decision.reason == "scale-out"
    assert any(isinstance(x, r.PlacementReport) for x in out)
    assert not any(isinstance(x, (r.Assign, r.Handoff)) for x in out)
    assert not shell.due(101.0)
    # the scale-out is in the view: booting workers count, so the next round does not repeat it
    assert not any(isinstance(x, r.ScaleOut) for x in shell.decide(140.0))


def test_a_scaling_decision_reports_the_band_the_policy_held_the_pool_to():
    """With an SLO, u* is the table's times the feedback's headroom, and the decision says the
    one the pool was held to (it said the table's, which the policy did not use)."""
    import pytest

    cfg = ControlConfig(dwell_s=30.0, slo_worst_s=3.0)
    shell = ControlShell(cfg, clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="p-0", ts=1, capacity=2, pool="default"))
    shell.fold(r.Heartbeat(worker_id="p-0", ts=99, sessions=2, executing=2, capacity=2))
    for i in range(6):
        shell.fold(r.SessionOpened(session_id=f"s{i}", ts=90.0 + i))
    (decision,) = [x for x in shell.decide(100.0) if isinstance(x, r.ScalingDecision)]
    policy = shell.policy(fit_capacity(load_profiles(cfg.profile), shell.view))
    table_u, table_delta = policy.table.lookup(decision.level)
    h = policy.config.headroom_start
    assert h < 1 and (decision.u_target, decision.delta) == pytest.approx((table_u * h, table_delta * h))


def test_a_round_declares_silent_workers_down():
    shell = ControlShell(ControlConfig(heartbeat_timeout_s=5.0))
    shell.fold(r.WorkerUp(worker_id="p-0", ts=1, capacity=2))
    out = shell.decide(50.0)
    assert r.WorkerDown(worker_id="p-0", ts=50.0, reason="missed heartbeats") in out
    assert not shell.view.workers["p-0"].alive


def test_a_round_rebalances_with_handoffs():
    shell = ControlShell(ControlConfig(policy="turboserve-no-autoscale", profile="paper", gpu_type="h20"))
    shell.fold(r.WorkerUp(worker_id="w0", ts=1, capacity=16, gpu_type="h20"))
    shell.fold(r.WorkerUp(worker_id="w1", ts=1, capacity=16, gpu_type="h20"))
    for i in range(8):
        shell.fold(r.SessionOpened(session_id=f"s{i}", ts=1))
        shell.fold(r.Claimed(worker_id="w0", session_id=f"s{i}", generation=G("w0", 1), ts=2))
    out = shell.decide(3.0)
    handoffs = [x for x in out if isinstance(x, r.Handoff)]
    assert handoffs and all(h.worker_id == "w0" and h.target_worker == "w1" for h in handoffs)
    (report,) = [x for x in out if isinstance(x, r.PlacementReport)]
    assert report.migrations == len(handoffs) and report.loads == {"w0": 8 - len(handoffs), "w1": len(handoffs)}
    assert not [x for x in shell.decide(4.0) if isinstance(x, r.Handoff)]  # in flight: not asked twice


def test_a_policy_that_keeps_idle_sessions_resident_is_refused_live():
    """Dispatch offloads every idle session, so a pinned policy would run live as another one
    under its name: the paper's baselines and a plug-in that says so are refused at start."""
    import pytest

    from schemas.errors import ConfigError

    for spec in ("rr", "lag", "mag", "tests.sim.plugin:OffloadElsewhere"):
        with pytest.raises(ConfigError, match="keeps idle sessions resident on their GPU, which only the simulator"):
            ControlShell(ControlConfig(policy=spec))
    ControlShell(ControlConfig(policy="lag-offload"))


def test_config_from_env():
    cfg = ControlConfig.from_env({"CHUNKSERVE_POLICY": "lag", "CHUNKSERVE_PROFILE": "paper",
                                  "CHUNKSERVE_GPU_TYPE": "b300", "CHUNKSERVE_MIN_WORKERS": "3",
                                  "CHUNKSERVE_CONTROL_TICK_S": "0.1", "CHUNKSERVE_BURST_MEMORY_S": "20"})
    assert (cfg.policy, cfg.profile, cfg.gpu_type, cfg.min_gpus, cfg.tick_s) == ("lag", "paper", "b300", 3, 0.1)
    assert cfg.burst_memory_s == 20.0 and ControlConfig().min_gpus == 2
    assert ControlConfig.from_env({}) == ControlConfig() and ControlConfig().slo is None
    settled = ControlConfig.from_env({"CHUNKSERVE_SETTLE_S": "0"})
    assert settled.settle_s == 0.0 and ControlConfig().settle_s == 120.0
    assert ControlShell(settled).policy(load_profiles(settled.profile)).autoscaler.settle_s == 0.0
    one = ControlConfig.from_env({"CHUNKSERVE_MIN_WORKERS": "1"})
    assert ControlShell(one).policy(load_profiles(one.profile)).autoscaler.min_gpus == 1


def test_a_bad_profile_or_gpu_type_names_its_variable():
    """They said "nope: profile: ..." and "reference-cpu: gpu_type: ...", naming no variable."""
    import pytest

    from schemas.errors import ConfigError

    for env, said in (({"CHUNKSERVE_PROFILE": "nope"}, "env CHUNKSERVE_PROFILE: profile: no built-in profile 'nope'"),
                      ({"CHUNKSERVE_GPU_TYPE": "h100"}, "env CHUNKSERVE_GPU_TYPE: gpu_type: no latency profile for 'h100'"),
                      ({"CHUNKSERVE_PROFILE": "/no/such.json"}, "env CHUNKSERVE_PROFILE: profile: /no/such.json: cannot read")):
        with pytest.raises(ConfigError) as info:
            ControlConfig.from_env(env)
        assert str(info.value).startswith(said), info.value


def test_an_slo_from_the_environment_reaches_the_autoscaler():
    """Either SLO setting turns the live autoscaler's SLO mode on (the other at its default);
    it then follows the chunks measured since each round (``snapshot.chunks``)."""
    import pytest

    from processors.autoscaler import Slo
    from schemas.errors import ConfigError

    cfg = ControlConfig.from_env({"CHUNKSERVE_SLO_WORST_S": "2"})
    assert cfg.slo == Slo(miss_rate=Slo().miss_rate, worst_s=2.0)
    assert ControlShell(cfg).policy(load_profiles(cfg.profile)).autoscaler.slo == cfg.slo
    assert ControlConfig.from_env({"CHUNKSERVE_SLO_MISS_RATE": "0.01"}).slo == Slo(0.01, Slo().worst_s)
    with pytest.raises(ConfigError, match="CHUNKSERVE_SLO_MISS_RATE"):
        ControlConfig.from_env({"CHUNKSERVE_SLO_MISS_RATE": "1.5"})
    with pytest.raises(ConfigError, match="CHUNKSERVE_SLO_WORST_S"):
        ControlConfig.from_env({"CHUNKSERVE_SLO_WORST_S": "0"})


def _world(shell: ControlShell) -> list[r.Record]:
    """Two workers, six sessions that open and go idle one by one: the autoscaler's timers
    and burst history move."""
    recs: list[r.Record] = [r.WorkerUp(worker_id=f"p-{i}", ts=1, capacity=4, pool="default") for i in range(2)]
    for i in range(6):
        recs += [r.SessionOpened(session_id=f"s{i}", ts=2.0 + i),
                 r.Claimed(worker_id=f"p-{i % 2}", session_id=f"s{i}", generation=G(f"p-{i % 2}", 1), ts=3.0 + i)]
    for rec in recs:
        shell.fold(rec)
    return recs


def test_the_policy_state_survives_a_leader_change_through_the_log():
    """The leader puts its policy state in the log after each round that changed it; an
    instance that folded the log takes over with that state, not a fresh one."""
    cfg = ControlConfig(dwell_s=30.0, heartbeat_timeout_s=1e9)
    leader = ControlShell(cfg)
    log = _world(leader)
    for t in (10.0, 20.0, 30.0, 40.0):
        leader.fold(r.SessionIdle(session_id=f"s{int(t) // 10}", ts=t - 1))
        out = leader.decide(t)
        log += [r.SessionIdle(session_id=f"s{int(t) // 10}", ts=t - 1), *out]
    states = [x for x in log if isinstance(x, r.PolicyState)]
    assert states and states[-1].policy == cfg.policy and states[-1].ts <= 40.0
    policy = make_policy(cfg.policy, load_profiles(cfg.profile), cfg.gpu_type)
    assert leader.policy_state != policy.initial_state()  # the state moved: there is something to lose

    successor = ControlShell(cfg)  # folded the same log, never led
    for rec in log:
        successor.fold(rec)
    amnesiac = ControlShell(cfg)  # the same log without the policy's state
    for rec in log:
        if not isinstance(rec, r.PolicyState):
            amnesiac.fold(rec)
    assert successor._policy_state(policy) == leader.policy_state
    assert amnesiac._policy_state(policy) != leader.policy_state  # what a restart used to lose
    # the leader's own state coming back from the log does not roll it back
    leader.fold(states[0])
    assert leader._policy_state(policy) == successor._policy_state(policy)


class _Recorder:
    """A plug-in policy that keeps the snapshots the live control round hands it."""

    name = "recorder"
    seen: list = []

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):  # noqa: ANN001
        from processors.policy import Decision

        _Recorder.seen.append(snapshot)
        return Decision((), state)


class _Sloppy:
    """A plug-in whose arithmetic hands numpy's scalars and fractions, and a malformed Place."""

    name = "sloppy"

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):  # noqa: ANN001
        import numpy as np

        from processors.decisions import Admit, Boot, Decision, Place

        return Decision((Boot(np.int64(2), "cpu"), Boot(2.5, "cpu"), Place(5, None),  # type: ignore[arg-type]
                         Admit((("p-0", np.float64(2.5)), ("p-0", 0)))), state)


def test_a_live_round_carries_a_plugins_numpy_counts_and_refuses_what_no_record_holds():
    """numpy's int64 for a Boot's count made the ScaleOut record refuse it and the round with
    it (every round, while the plug-in did so); counts are now Python ints, an admission
    entry's rounded up (2.5 admits as 3 does: a worker holding fewer than 2.5 holds fewer
    than 3), and a fractional Boot or a malformed command is left out, the rest carried out."""
    shell = ControlShell(ControlConfig(policy=f"{__name__}:_Sloppy"), clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="p-0", ts=99.0, capacity=4, pool="default"))
    out = shell.decide(100.0)
    (scale,) = [x for x in out if isinstance(x, r.ScaleOut)]
    (plan,) = [x for x in out if isinstance(x, r.AdmissionPlan)]
    assert scale.count == 2 and type(scale.count) is int
    assert [(s.worker_id, s.count) for s in plan.order] == [("p-0", 3)]


def test_an_admission_count_past_any_gpu_is_held_to_a_bound_and_an_infinite_one_is_refused():
    """A plug-in's 1e30 made a count the plan's 64-bit field refuses (and the round with it):
    it admits the same sessions as ADMIT_COUNT_MAX; an infinite count is not carried."""
    from processors.agents.control_records import ADMIT_COUNT_MAX, admission_plan, carried
    from processors.decisions import Admit

    out, refused = carried([Admit((("p-0", 1e30), ("p-1", 10**40), ("p-2", 3))), Admit((("p-0", float("inf")),))])
    assert refused == 1 and out == (Admit((("p-0", ADMIT_COUNT_MAX), ("p-1", ADMIT_COUNT_MAX), ("p-2", 3))),)
    assert [s.count for s in admission_plan(out, 1.0).order] == [ADMIT_COUNT_MAX, ADMIT_COUNT_MAX, 3]


def test_the_live_round_gives_a_policy_idle_ages_and_the_events_since_the_last_round():
    """What docs/scheduling.md ("The policies, and writing one") says a plug-in sees live, as in the simulator: each session's ``since``
    (its last session event) and the session events folded since the previous round."""
    _Recorder.seen.clear()
    shell = ControlShell(ControlConfig(policy=f"{__name__}:_Recorder"), clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="p-0", ts=1, capacity=4, pool="default"))
    shell.fold(r.SessionOpened(session_id="a", ts=10.0))
    shell.fold(r.SessionIdle(session_id="a", ts=40.0))
    shell.decide(50.0)
    shell.fold(r.SessionActive(session_id="a", ts=60.0))
    shell.decide(70.0)
    first, second = _Recorder.seen
    assert [(e.session_id, e.kind.value, e.t) for e in first.events] == [("a", "open", 10.0), ("a", "idle", 40.0)]
    assert [s.since for s in first.sessions if s.id == "a"] == [40.0]  # idle for 10 s at 50
    assert [(e.kind.value, e.t) for e in second.events] == [("active", 60.0)]


def test_the_live_round_gives_a_policy_the_chunks_measured_since_the_last_round():
    """``snapshot.chunks`` live: the chunks the workers reported since the previous round, a
    chunk past its deadline when it took longer than its worker's chunk interval (WorkerUp);
    a worker that did not say its interval misses none; the deadline is the shortest interval
    among the chunks. A round another leader took (its
    PolicyState in the log) saw the chunks before it."""
    _Recorder.seen.clear()
    shell = ControlShell(ControlConfig(policy=f"{__name__}:_Recorder"), clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="p-0", ts=1, capacity=4, chunk_interval_s=0.1))
    shell.fold(r.WorkerUp(worker_id="p-1", ts=1, capacity=4))

    def chunk(worker: str, latency_s: float, index: int) -> r.ChunkDone:
        return r.ChunkDone(worker_id=worker, session_id="a", generation=r.Generation(worker, 1),
                           chunk_index=index, ts=2.0, latency_s=latency_s)

    for i, (w, lat) in enumerate((("p-0", 0.05), ("p-0", 0.25), ("p-1", 0.5))):
        shell.fold(chunk(w, lat, i))
    shell.decide(50.0)
    shell.decide(60.0)
    shell.fold(chunk("p-0", 0.07, 3))
    shell.fold(r.PolicyState(pool="default", ts=65.0, policy=shell.config.policy, state=b""))
    shell.fold(chunk("p-0", 0.3, 4))
    shell.decide(70.0)
    first, second, third = _Recorder.seen
    assert (first.chunks.count, first.chunks.missed, first.chunks.worst_s) == (3, 1, 0.5)
    assert first.chunks.deadline_s == 0.1  # the deadline judged against (p-1 said none)
    assert second.chunks.count == 0 and second.chunks.deadline_s == 0.0
    assert (third.chunks.count, third.chunks.missed, third.chunks.worst_s) == (1, 1, 0.3)


def test_live_turboserve_does_not_follow_the_worst_chunk():
    """Workers report a chunk's compute time, not the wait a first chunk sees: the live
    control processor builds turboserve with the worst-chunk rule off, the simulator with it on."""
    from processors.turboserve import TurboServe

    live = make_policy("turboserve", load_profiles("paper"), "b300", burst_memory_s=900.0)
    assert isinstance(live, TurboServe) and live.autoscaler.follow_worst is None
    assert live.autoscaler.burst_memory_s == 900.0 and live.autoscaler.gpu_type == "b300"
    assert TurboServe().autoscaler.follow_worst == 0.75
    assert make_policy("turboserve", load_profiles("paper"), "b300", follow_worst=0.7).autoscaler.follow_worst == 0.7


def test_a_worker_started_by_hand_with_fewer_slots_is_planned_at_its_own():
    """A hand-started worker of 4 slots beside the provisioner's of 8 (one GPU type): each is
    planned at the slots it reports. Both read as the profile's before, and the autoscaler
    drained the provisioner's worker to fit three sessions onto the hand one, found it over
    the band and booted another, in a loop (an outside run: five cycles in 3.5 minutes)."""
    clock = {"now": 100.0}
    shell = ControlShell(ControlConfig(pool="default", boot_s=10.0, dwell_s=30.0), clock=lambda: clock["now"])
    shell.fold(r.WorkerProvisioned(worker_id="p-0", ts=1, provisioner="provisioner-default", pool="default"))
    shell.fold(r.WorkerUp(worker_id="p-0", ts=2, capacity=8, pool="default"))
    shell.fold(r.WorkerUp(worker_id="hand-1", ts=2, capacity=4, pool="default"))
    for i in range(3):
        shell.fold(r.SessionOpened(session_id=f"s{i}", ts=3.0))
        shell.fold(r.Claimed(worker_id="p-0", session_id=f"s{i}", generation=G("p-0", 1), ts=4.0))
    out = []
    for t in range(100, 400, 5):
        clock["now"] = float(t)
        for w, n in (("p-0", 3), ("hand-1", 0)):
            shell.fold(r.Heartbeat(worker_id=w, ts=t - 0.5, sessions=n, executing=n, capacity=8 if w == "p-0" else 4))
        out += shell.decide(float(t))
    assert not [x for x in out if isinstance(x, (r.Drain, r.ScaleOut, r.Handoff))], out
    model = fit_capacity(shell.model, shell.view)
    assert (model["cpu"].capacity, model["cpu@4"].capacity) == (8, 4)
    assert {g.id: g.type for g in to_snapshot(shell.view, 400.0, model=model).gpus} == {"p-0": "cpu", "hand-1": "cpu@4"}


class _OwnModel:
    """A plug-in that keeps a model of its own (it takes no ``model``) and reads each GPU's
    slots from it."""

    name = "own-model"

    def __init__(self) -> None:
        self.model = load_profiles("reference-cpu")

    def initial_state(self) -> None:
        return None

    def decide(self, snapshot, signal, state):  # noqa: ANN001
        from processors.policy import Decision

        assert all(self.model[g.type].capacity > 0 for g in snapshot.gpus)
        return Decision((), state)


class _Raising(_OwnModel):
    name = "raising"

    def decide(self, snapshot, signal, state):  # noqa: ANN001
        raise RuntimeError("a bug of the plug-in's")


def test_a_plug_in_with_its_own_model_sees_the_pool_typed_as_its_model_has_it_and_a_failing_one_still_declares_deaths():
    """Only a policy that plans with control's fitted model is shown ``TYPE@K`` workers (a
    plug-in that read its own model met a type it had no profile for, every round); a plug-in
    that raises makes no decision, and the round's deaths are published all the same."""
    for plug, want in ((_OwnModel, {"p-0": "cpu", "hand-1": "cpu"}), (_Raising, None)):
        shell = ControlShell(ControlConfig(policy=f"{__name__}:{plug.__name__}", heartbeat_timeout_s=5.0),
                             clock=lambda: 100.0)
        assert not shell.typed
        shell.fold(r.WorkerProvisioned(worker_id="p-0", ts=1, provisioner="provisioner-default", pool="default"))
        shell.fold(r.WorkerUp(worker_id="p-0", ts=2, capacity=8, pool="default"))
        shell.fold(r.WorkerUp(worker_id="hand-1", ts=2, capacity=4, pool="default"))
        shell.fold(r.WorkerUp(worker_id="gone", ts=2, capacity=8, pool="default"))
        for w in ("p-0", "hand-1"):
            shell.fold(r.Heartbeat(worker_id=w, ts=99.0, sessions=0, executing=0, capacity=8 if w == "p-0" else 4))
        out = shell.decide(100.0)
        assert [x.worker_id for x in out if isinstance(x, r.WorkerDown)] == ["gone"]
        if want is not None:
            assert any(isinstance(x, r.PlacementReport) for x in out)
            assert {g.id: g.type for g in to_snapshot(shell.view, 100.0, heartbeat_timeout_s=5.0).gpus} == want
        else:
            assert len(out) == 1
    # one that takes the model is offered control's fitted one, and sees the pool typed by slots
    assert ControlShell(ControlConfig(policy="examples.policies.target_util:TargetUtil")).typed


def test_a_worker_reporting_more_slots_than_a_profile_holds_leaves_the_fit_as_it_was():
    """A profile holds at most 4,096 sessions per GPU: a worker reporting more is planned at
    its type's K rather than made a type that cannot exist (which raised in every round)."""
    shell = ControlShell(ControlConfig())
    shell.fold(r.WorkerUp(worker_id="big", ts=1, capacity=5000))
    shell.fold(r.WorkerUp(worker_id="small", ts=1, capacity=4))
    model = fit_capacity(shell.model, shell.view)
    assert sorted((k, model[k].capacity) for k in model) == [("cpu", 4)]
