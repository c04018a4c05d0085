"""Admission plans: the policy says where the next sessions go; dispatch and the simulator
admit by the same rule (``processors.admission.candidate``). Pure: no Kafka, no Redis."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from processors import decisions as d
from processors.agents.control import ControlShell
from processors.agents.control_config import ControlConfig
from processors.agents.control_records import admission_plan
from processors.admission import AdmitPlan, WorkerLoad, admit_in_turn, candidate
from processors.dispatch import Commit, Committed, DispatchView, Facts, Retry, RetryLater, Seen, decide
from processors.latency import load_profiles
from processors.placement import admission_order
from processors.snapshot import Gpu, GpuState, Session, Snapshot
from processors.turboserve import TurboServe
from schemas import records as r

LOADS = {"a": WorkerLoad(2, 4), "b": WorkerLoad(0, 4), "c": WorkerLoad(1, 4), "d": WorkerLoad(0, 4, draining=True)}


_IDS = st.sampled_from("abcde")
_LOAD = st.builds(WorkerLoad, st.integers(0, 6), st.integers(0, 6), st.booleans(), st.booleans())


@settings(max_examples=300, deadline=None)
@given(workers=st.dictionaries(_IDS, _LOAD), order=st.lists(st.tuples(_IDS, st.integers(0, 8)), max_size=12),
       pinned=st.dictionaries(st.sampled_from(["s0", "s1", "s5"]), _IDS), fallback=st.booleans(), planned=st.booleans(),
       n=st.integers(0, 10))
def test_admitting_in_turn_is_candidate_asked_after_each_admission(workers, order, pinned, fallback, planned, n):
    """The simulator's walk (the order read once) gives what dispatch gives asking
    ``candidate`` for one session after another, each counted where it went."""
    plan = AdmitPlan(tuple(order), pinned, fallback) if planned else None
    sessions = [f"s{k}" for k in range(n)]
    load, want = dict(workers), []
    for sid in sessions:
        best = candidate(plan, load, sid)
        if best is not None:
            w = load[best]
            load[best] = WorkerLoad(w.used + 1, w.capacity, w.draining, w.down)
        want.append(best)
    assert admit_in_turn(plan, workers, sessions) == want


def test_no_plan_means_least_loaded():
    assert candidate(None, LOADS, "s") == "b"
    assert candidate(None, LOADS, "s", exclude=frozenset({"b"})) == "c"


def test_the_plan_order_comes_first_and_skips_workers_already_at_the_entry_count():
    plan = AdmitPlan(order=(("a", 2), ("c", 2), ("a", 3), ("d", 1)), fallback=False)
    # a holds 2 already: its count-2 entry is taken, its count-3 entry is not; d drains
    assert candidate(plan, LOADS, "s") == "c"
    assert candidate(plan, LOADS, "s", exclude=frozenset({"c"})) == "a"
    assert candidate(plan, LOADS, "s", exclude=frozenset({"a", "c"})) is None  # wait for the policy


def test_a_pin_goes_first_and_fallback_adds_the_least_loaded():
    plan = AdmitPlan(order=(("c", 2),), pinned={"s": "a"}, fallback=True)
    assert candidate(plan, LOADS, "s") == "a"
    assert candidate(plan, LOADS, "other") == "c"
    assert candidate(plan, LOADS, "other", exclude=frozenset({"c"})) == "b"


def test_without_fallback_a_session_past_the_order_waits_for_the_policy():
    view = DispatchView(LOADS, admission_retries=3)
    view, _ = decide(view, Seen(r.AdmissionPlan(pool="p", ts=5.0, policy="rr", fallback=False), Facts(None)), 5.0)
    view, cmds = decide(view, Seen(r.SessionOpened(session_id="s", ts=5.1), Facts(None)), 5.1)
    assert [type(c) for c in cmds] == [RetryLater]
    plan = r.AdmissionPlan(pool="p", ts=6.0, policy="rr", fallback=False, pinned={"s": "c"})
    view, _ = decide(view, Seen(plan, Facts(None)), 6.0)
    view, cmds = decide(view, Retry(cmds[0].admission, Facts(None)), 6.2)
    assert [(type(c), c.worker) for c in cmds] == [(Commit, "c")]


def test_an_older_plan_does_not_replace_a_newer_one_and_admissions_follow_the_order():
    view = DispatchView(LOADS, admission_retries=3)
    new = r.AdmissionPlan(pool="p", ts=9.0, policy="turboserve",
                          order=(r.AdmitSlot(worker_id="c", count=2), r.AdmitSlot(worker_id="c", count=3)))
    old = r.AdmissionPlan(pool="p", ts=8.0, policy="turboserve", order=(r.AdmitSlot(worker_id="a", count=3),))
    view, _ = decide(view, Seen(new, Facts(None)), 9.0)
    view, _ = decide(view, Seen(old, Facts(None)), 9.1)
    placed = []
    for sid in ("s1", "s2", "s3"):
        view, cmds = decide(view, Seen(r.SessionOpened(session_id=sid, ts=9.2), Facts(None)), 9.2)
        (commit,) = [c for c in cmds if isinstance(c, Commit)]
        placed.append(commit.worker)
        view, _ = decide(view, Committed(commit.admission, r.Generation(commit.worker, 1)), 9.2)
    assert placed == ["c", "c", "b"]  # the order, then least-loaded (fallback)


def test_admission_order_fills_the_least_latency_positions_of_ready_gpus():
    model = load_profiles("paper")
    gtype = next(iter(model))
    k = model[gtype].capacity
    snap = Snapshot(0.0, (Gpu("g0", gtype), Gpu("g1", gtype), Gpu("g2", gtype, GpuState.BOOTING)), ())
    order = admission_order(snap, model, {"g0": 2, "g1": 0}, limit=4)
    assert order == (("g1", 1), ("g1", 2), ("g0", 3), ("g1", 3))
    full = admission_order(snap, model, {"g0": k, "g1": k})
    assert full == ()


def test_control_turns_admit_place_and_resume_into_one_plan_and_sends_it_only_when_it_changes():
    cmds = [d.Admit((("w1", 2), ("booting:1", 1))), d.Place("s1", "w2"), d.Restore("s2", "booting:3"),
            d.Migrate("s3", "w1", "w2", 0.1, 0.01)]
    plan = admission_plan(cmds, 4.0, pool="p", policy="turboserve", decision_id="x")
    assert plan.order == (r.AdmitSlot(worker_id="w1", count=2),) and plan.fallback
    assert plan.pinned == {"s1": "w2"}  # no worker to commit on while it boots
    assert not admission_plan([d.Place("s1", "w2")], 4.0).fallback  # no Admit: wait for the pins
    shell = ControlShell(ControlConfig(policy="turboserve-no-autoscale"), clock=lambda: 100.0)
    shell.fold(r.WorkerUp(worker_id="w1", ts=99.0, capacity=4, gpu_type="cpu", pool="default"))
    first = [x for x in shell.decide(100.0) if isinstance(x, r.AdmissionPlan)]
    again = [x for x in shell.decide(100.5) if isinstance(x, r.AdmissionPlan)]
    assert len(first) == 1 and first[0].order and again == []


def test_turboserve_ends_every_decision_with_its_admission_order():
    model = load_profiles("paper")
    gtype = next(iter(model))
    snap = Snapshot(0.0, (Gpu("g0", gtype), Gpu("g1", gtype)), (Session("s1", gpu_id="g0"),))
    decision = TurboServe(model=model, autoscale=False).decide(snap, None, TurboServe().initial_state())
    admit = decision.commands[-1]
    assert isinstance(admit, d.Admit) and admit.order[0] == ("g1", 1)


def test_the_least_loaded_baseline_gives_its_rule_ahead_as_an_order_and_the_pinned_ones_do_not():
    from processors.baselines import Base, PinnedLag

    model = load_profiles("paper")
    gtype = next(iter(model))
    snap = Snapshot(0.0, (Gpu("g0", gtype), Gpu("g1", gtype)),
                    (Session("s1", gpu_id="g0"), Session("s2", gpu_id="g0"), Session("s3")))
    decision = Base(model=model).decide(snap, None, 0)
    assert decision.commands[0] == d.Place("s3", "g1")
    admit = decision.commands[-1]
    assert isinstance(admit, d.Admit) and admit.order[:3] == (("g1", 2), ("g0", 3), ("g1", 3))
    assert not any(isinstance(c, d.Admit) for c in PinnedLag(model=model).decide(snap, None, 0).commands)
