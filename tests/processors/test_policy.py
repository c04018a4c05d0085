import math
from collections import namedtuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.decisions import Admit, Decision, Migrate, well_formed
from processors.detector import DetectorConfig, DetectorState, step
from processors.lifecycle import EventKind, SessionEvent, SessionState, on_event
from processors.oracles import future_active
from processors.policy import BUILTIN_POLICIES, Policy, load_policy
from processors.snapshot import Gpu, GpuState, Snapshot
from schemas.errors import ConfigError
from tests.processors.strategies import PAPER, apply


class Pinned:
    """A third-party policy: does nothing."""

    name = "pinned"

    def initial_state(self):
        return 0

    def decide(self, snapshot, signal, state):
        return Decision((), state + 1)


def _trace(n=60):
    events, t = [], 0.0
    for i in range(n):
        t += 0.7
        events.append(SessionEvent(t, f"s{i}", EventKind.OPEN, 200 << 20))
        if i % 3 == 0:
            events.append(SessionEvent(t + 0.1, f"s{i // 2}", EventKind.IDLE))
        if i % 5 == 0:
            events.append(SessionEvent(t + 0.2, f"s{i // 2}", EventKind.ACTIVE))
        if i % 4 == 0:
            events.append(SessionEvent(t + 0.3, f"s{i // 3}", EventKind.CLOSE))
    return events


def _simulate(policy, events):
    """A minimal epoch loop: every command completes at once; booted GPUs are ready next epoch."""
    gpus = {f"g{i}": Gpu(f"g{i}", "h20") for i in range(3)}
    sessions, det, state, config = {}, DetectorState(), policy.initial_state(), DetectorConfig()
    for ev in events:
        det, signal = step(det, ev, config)
        sessions[ev.session_id], _ = on_event(sessions.get(ev.session_id), ev)
        gpus = {g: (x if x.state is not GpuState.BOOTING else Gpu(g, x.type)) for g, x in gpus.items()}
        snap = Snapshot(ev.t, tuple(gpus.values()), tuple(s for s in sessions.values() if s.lifecycle is not SessionState.TERMINATED))
        decision = policy.decide(snap, signal, state)
        assert decision == policy.decide(snap, signal, state)
        state = decision.state
        after = apply(snap, decision.commands)
        for c in decision.commands:
            if isinstance(c, Migrate):
                assert c.reason == "drain" or c.gamma > 0
        gpus = {g.id: g for g in after.gpus}
        for g, n in after.loads().items():
            assert n <= PAPER[gpus[g].type].capacity
        sessions.update({s.id: s for s in after.sessions})
    return gpus


@pytest.mark.parametrize("name", sorted(BUILTIN_POLICIES))
def test_every_builtin_runs_the_same_loop(name):
    events = _trace()
    options = {"future": future_active(events, 30.0)} if name.startswith("oracle") else {}
    if name.startswith(("turboserve", "oracle")):
        from processors.autoscaler import AutoscalerConfig

        options["autoscaler"] = AutoscalerConfig(gpu_type="h20", dwell_s=2.0)
    policy = load_policy(name, **options)
    assert isinstance(policy, Policy) and policy.name == name
    _simulate(policy, events)


def test_module_name_specs_and_errors():
    policy = load_policy("tests.processors.test_policy:Pinned")
    assert policy.name == "pinned"
    _simulate(policy, _trace(10))
    for bad in ("nope", "no.such.module:X", "processors.policy:Nope", "processors.decisions:Decision"):
        with pytest.raises(ConfigError):
            load_policy(bad)
    with pytest.raises(ConfigError):
        load_policy("oracle-autoscale")


def test_future_active_counts_peaks_per_window():
    events = [SessionEvent(t, f"s{t}", EventKind.OPEN) for t in (1, 2, 3)] + [
        SessionEvent(12, "s1", EventKind.IDLE), SessionEvent(25, "s2", EventKind.CLOSE)]
    assert future_active(events, 10.0) == (3, 3, 2)  # a window starts with what the last one left


@pytest.mark.parametrize("seed", range(30))
def test_greedy_placement_picks_the_lowest_score_then_id_for_every_waiting_session(seed):
    """Fewest sessions, least latency and (one memory size) least memory pick GPUs from a
    heap; each pick must still be the plain minimum of (score, id) over the GPUs with room,
    with the counts and bytes so far."""
    import random

    from processors.baselines import _fewest, _latency, _memory, greedy_place
    from processors.snapshot import Session

    rng = random.Random(seed)
    types = ["b300", "h20"] if seed % 2 else [rng.choice(["b300", "h20"])]
    gpus = tuple(Gpu(f"g{i}", rng.choice(types), rng.choice([GpuState.READY] * 4 + [GpuState.BOOTING])) for i in range(rng.randint(1, 6)))
    sessions = []
    for i in range(rng.randint(0, 120)):
        where = rng.choice([g.id for g in gpus] + [None, None, "gone"])
        life = rng.choice([SessionState.EXECUTION] * 3 + [SessionState.SUSPENDED])
        sessions.append(Session(f"s{i:03d}", rng.randint(1, 4 << 30), life, where))
    snap = Snapshot(0.0, gpus, tuple(sessions))
    for score in (_fewest, _latency, _memory):
        for pinned in (False, True):
            cmds, _ = greedy_place(snap, PAPER, score, pinned=pinned)
            mine = {g.id: [s for s in sessions if s.gpu_id == g.id] for g in gpus}
            n = {g: sum(1 for s in ss if s.lifecycle is SessionState.EXECUTION) for g, ss in mine.items()}
            held = {g: len(ss) if pinned else n[g] for g, ss in mine.items()}
            mem = {g: sum(s.state_bytes for s in ss if pinned or s.lifecycle is SessionState.EXECUTION) for g, ss in mine.items()}
            waiting = [s for s in sessions if s.lifecycle is SessionState.EXECUTION and s.gpu_id not in n]
            if pinned:  # a session that opened idle is pinned at its open too, after those executing
                waiting += [s for s in sessions if s.lifecycle is SessionState.SUSPENDED and s.gpu_id is None]
            for s, c in zip(waiting, cmds):
                room = [g for g in gpus if g.state is GpuState.READY and held[g.id] < PAPER[g.type].capacity]
                want = min((score(PAPER[g.type], n[g.id], mem[g.id], s.state_bytes), g.id) for g in room)[1]
                assert (c.session_id, c.gpu_id) == (s.id, want)
                n[want] += s.lifecycle is SessionState.EXECUTION
                held[want] += 1
                mem[want] += s.state_bytes
            room = [g for g in gpus if g.state is GpuState.READY and held[g.id] < PAPER[g.type].capacity]
            assert len(cmds) == len(waiting) or not room


class _Name(str):
    pass


_Pair = namedtuple("_Pair", "gpu count")


_entries = st.one_of(
    st.tuples(st.one_of(st.text(max_size=3), st.builds(_Name, st.text(max_size=3)), st.none(), st.integers()),
              st.one_of(st.integers(-5, 50), st.floats(), st.booleans(), st.none(), st.text(max_size=2))),
    st.lists(st.one_of(st.text(max_size=2), st.integers(0, 9)), max_size=3),
    st.builds(lambda a, b: _Pair(a, b), st.text(max_size=2), st.integers(0, 9)),
    st.integers(), st.none(), st.text(max_size=2))


@settings(max_examples=400, deadline=None)
@given(st.one_of(st.lists(_entries, max_size=6), st.lists(_entries, max_size=6).map(tuple), st.none(), st.integers(), st.text(max_size=3)))
def test_an_admission_order_is_well_formed_exactly_when_each_entry_is_a_name_and_a_number(order):
    """The shell checks every round's admission order (a column at a time for the common
    shape): it must accept exactly the orders whose entries are each a pair (tuple or list)
    of a name (a str) and a finite number (int or float, not bool), subclasses included: an
    infinite count (or NaN) admits without bound in the simulator and no record holds it."""
    def number(x):
        return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

    want = isinstance(order, (tuple, list)) and all(
        isinstance(e, (tuple, list)) and len(e) == 2 and isinstance(e[0], str) and number(e[1]) for e in order)
    assert well_formed(Admit(order)) is want
    assert well_formed(Admit((("g0", 3), ["g1", 2.5]))) and not well_formed(Admit((("g0", True),)))
    assert well_formed(Admit((("g0", 10**400),))) and not well_formed(Admit((("g0", float("inf")),)))
