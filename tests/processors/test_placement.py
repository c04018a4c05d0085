import itertools
import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processors.decisions import Migrate, Place, Restore
from processors.lifecycle import SessionState
from processors.oracles import exhaustive_placement, plan_objective
from processors.placement import RebalanceConfig, plan_placement, worst_latency
from processors.snapshot import Gpu, GpuState, Session, Snapshot
from processors.turboserve import TURBOSERVE_REBALANCE
from tests.processors.strategies import PAPER, SMALL, apply, snapshots

CONFIGS = st.builds(
    RebalanceConfig,
    eta=st.sampled_from([0.0, 0.1, 1.0]),
    alpha_s=st.sampled_from([0.0, 0.02]),
    max_moves=st.sampled_from([0, 3, 10_000]),
)


def _check_invariants(snap, plan, model):
    after = apply(snap, plan.commands, model)
    gpus = {g.id: g for g in after.gpus}
    loads = after.loads()
    for gid, n in loads.items():
        before = snap.loads()[gid]
        assert n <= max(model[gpus[gid].type].capacity, before)  # never pushed above K
    executing = [s for s in after.sessions if s.lifecycle is SessionState.EXECUTION]
    placed = [s for s in executing if s.gpu_id in gpus]
    assert len({s.id for s in placed}) == len(placed)
    assert len(placed) + len(plan.unplaced) == len(executing)
    room = sum(max(0, model[g.type].capacity - snap.loads()[g.id]) for g in snap.gpus if g.state is GpuState.READY)
    waiting = [s for s in snap.sessions if s.lifecycle is SessionState.EXECUTION and s.gpu_id is None]
    if len(waiting) <= room:
        assert plan.unplaced == ()  # every executing session on exactly one GPU
    for c in plan.commands:
        if isinstance(c, (Place, Restore, Migrate)):
            target = c.gpu_id if not isinstance(c, Migrate) else c.dst
            assert gpus[target].state is GpuState.READY
    assert plan.loads == loads
    return after


@settings(max_examples=120, deadline=None)
@given(snapshots(max_gpus=10), CONFIGS)
def test_placement_invariants_and_gamma(snap, cfg):
    plan = plan_placement(snap, PAPER, cfg)
    after = _check_invariants(snap, plan, PAPER)
    moves = [c for c in plan.commands if isinstance(c, Migrate)]
    assert len(moves) <= cfg.max_moves
    for m in moves:
        assert m.gamma > 0 and m.reason == "rebalance"
        assert m.cost_s == pytest.approx(cfg.kappa(next(s.state_bytes for s in snap.sessions if s.id == m.session_id)))
    placed_only = plan_placement(snap, PAPER, cfg, rebalance=False)
    assert worst_latency(after, PAPER) <= worst_latency(apply(snap, placed_only.commands), PAPER) + 1e-12
    assert plan.worst_after == pytest.approx(worst_latency(after, PAPER))


@settings(max_examples=60, deadline=None)
@given(snapshots(max_gpus=8), CONFIGS)
def test_rebalance_never_raises_worst_latency(snap, cfg):
    settled = apply(snap, plan_placement(snap, PAPER, cfg, rebalance=False).commands)
    plan = plan_placement(settled, PAPER, cfg)
    assert plan.worst_after <= plan.worst_before + 1e-12
    assert not any(isinstance(c, (Place, Restore)) for c in plan.commands) or plan.unplaced == ()
    again = plan_placement(apply(settled, plan.commands), PAPER, cfg)
    if cfg.max_moves > 100:  # converged: nothing left with Gamma > 0
        assert not any(isinstance(c, Migrate) for c in again.commands)


@settings(max_examples=60, deadline=None)
@given(snapshots(max_gpus=8, draining=True, booting=True), CONFIGS, st.randoms(use_true_random=False))
def test_same_snapshot_same_decision(snap, cfg, rnd):
    gpus = list(snap.gpus)
    rnd.shuffle(gpus)
    shuffled = Snapshot(snap.now, tuple(gpus), snap.sessions)
    first = plan_placement(snap, PAPER, cfg)
    assert first == plan_placement(snap, PAPER, cfg)
    assert first.commands == plan_placement(shuffled, PAPER, cfg).commands
    _check_invariants(snap, first, PAPER)


@settings(max_examples=40, deadline=None)
@given(snapshots(max_gpus=8, draining=True))
def test_draining_gpus_are_evacuated(snap):
    plan = plan_placement(snap, PAPER, RebalanceConfig())
    after = apply(snap, plan.commands)
    loads = after.loads()
    draining = [g.id for g in snap.gpus if g.state is GpuState.DRAINING]
    room = sum(max(0, PAPER[g.type].capacity - snap.loads()[g.id]) for g in snap.gpus if g.state is GpuState.READY)
    if sum(snap.loads()[g] for g in draining) + sum(1 for s in snap.sessions if s.gpu_id is None and s.lifecycle is SessionState.EXECUTION) <= room:
        assert all(loads[g] == 0 for g in draining)


def _brute_force(snap, model, cfg):
    """Every assignment of every executing session to every GPU."""
    gpus = list(snap.gpus)
    execs = [s for s in snap.sessions if s.lifecycle is SessionState.EXECUTION]
    best = math.inf
    for choice in itertools.product(range(len(gpus)), repeat=len(execs)):
        n = [0] * len(gpus)
        cost = 0.0
        for s, j in zip(execs, choice):
            n[j] += 1
            if s.gpu_id is not None and s.gpu_id != gpus[j].id:
                cost += cfg.kappa(s.state_bytes)
        if any(k > model[g.type].capacity for k, g in zip(n, gpus)):
            continue
        best = min(best, max(model[g.type].latency(k) for k, g in zip(n, gpus)) + cfg.eta * cost)
    return best


@settings(max_examples=40, deadline=None)
@given(st.data(), st.sampled_from([0.0, 0.05, 0.5]))
def test_oracle_matches_brute_force_and_bounds_the_heuristic(data, eta):
    m = data.draw(st.integers(2, 3))
    gpus = tuple(Gpu(f"g{i}", data.draw(st.sampled_from(["a", "b"]))) for i in range(m))
    sessions = []
    for g in gpus:
        for _ in range(data.draw(st.integers(0, min(3, SMALL[g.type].capacity)))):
            sessions.append(Session(f"s{len(sessions)}", data.draw(st.integers(0, 2 << 30)), gpu_id=g.id))
    for _ in range(data.draw(st.integers(0, 2))):
        sessions.append(Session(f"s{len(sessions)}", 0))
    snap = Snapshot(0.0, gpus, tuple(sessions))
    cfg = RebalanceConfig(eta=eta, max_moves=100)
    oracle = exhaustive_placement(snap, SMALL, cfg)
    assert oracle.objective == pytest.approx(_brute_force(snap, SMALL, cfg))
    ours = plan_objective(plan_placement(snap, SMALL, cfg), cfg)
    assert ours >= oracle.objective - 1e-9


def test_tied_bottlenecks_move_together():
    gpus = tuple(Gpu(f"g{i}", "h20") for i in range(4))
    sessions = tuple(Session(f"s{i}", 1 << 20, gpu_id=f"g{i % 2}") for i in range(10))
    plan = plan_placement(Snapshot(0.0, gpus, sessions), PAPER, RebalanceConfig())
    assert sorted(plan.loads.values()) == [2, 2, 3, 3]
    assert all(c.gamma > 0 for c in plan.commands)


@settings(max_examples=60, deadline=None)
@given(snapshots(max_gpus=8, draining=True, booting=True), CONFIGS)
def test_zero_transient_cap_blocks_every_move_but_not_placement(snap, cfg):
    capped = RebalanceConfig(cfg.eta, cfg.alpha_s, cfg.beta_s_per_byte, cfg.max_moves, max_transient_s=0.0)
    plan = plan_placement(snap, PAPER, capped)
    assert not any(isinstance(c, Migrate) for c in plan.commands)
    assert plan.commands == plan_placement(snap, PAPER, capped, rebalance=False).commands


def test_transient_cap_keeps_a_drained_gpus_sessions_off_busy_gpus():
    # b300: l(30) = 0.83, l(31) = 0.845; moving 1 GB costs 0.02 + 0.04 s
    busy = [Session(f"b{i}", 0, gpu_id="g001") for i in range(30)]
    drained = [Session("d0", 10**9, gpu_id="g000")]
    gpus = (Gpu("g000", "b300", GpuState.DRAINING), Gpu("g001", "b300", GpuState.READY))
    snap = Snapshot(0.0, gpus, tuple(busy + drained))
    free = plan_placement(snap, PAPER, RebalanceConfig(eta=1.0, max_transient_s=math.inf))
    assert [c.reason for c in free.commands if isinstance(c, Migrate)] == ["drain"]
    assert RebalanceConfig().transient(0.06, 0.83, 0.845) == pytest.approx(1.735)
    for cap, moves in ((1.7, 0), (1.75, 1)):
        plan = plan_placement(snap, PAPER, RebalanceConfig(eta=1.0, max_transient_s=cap))
        assert sum(isinstance(c, Migrate) for c in plan.commands) == moves


@pytest.mark.parametrize("huge", [False, True])
def test_each_gpus_sessions_are_read_cheapest_first_ties_in_snapshot_order(huge):
    """The placement reads each GPU's sessions by state size, ties in snapshot order (one
    sort key while sizes fit in 41 bits, two keys past that): the cheapest move is first."""
    from processors.placement import _Parsed

    big = (1 << 41) if huge else 0
    sizes = [5, 3, 5, 1, big + 2, 3, 0, big + 1]
    gpus = (Gpu("g1", "h20"), Gpu("g0", "h20"))
    sessions = tuple(Session(f"s{k}", size, gpu_id=("g1", "g0")[k % 2]) for k, size in enumerate(sizes))
    pz = _Parsed(Snapshot(0.0, gpus, sessions), PAPER, RebalanceConfig())
    got = [pz.execs[k].id for k in pz.order.tolist()]
    want = sorted(range(len(sizes)), key=lambda k: (("g1", "g0")[k % 2], sizes[k], k))
    assert got == [f"s{k}" for k in want]
    assert pz.have.tolist() == [4, 4]
    assert not pz.lat.flags.writeable and not any(c.flags.writeable for c in pz.curves)  # shared between decisions


def test_with_an_slo_a_drained_gpus_sessions_move_within_its_worst_chunk():
    """A drained GPU's four sessions can go only where 24 already run: the move's next
    chunk (transfer, the running chunk, its own) passes 1.4 s, so turboserve keeps them
    there without an SLO; with one, the limit is the SLO's worst chunk (3 s) and it moves them
    (each such chunk a miss the error budget counts)."""
    from processors.autoscaler import Slo
    from processors.turboserve import TurboServe

    gpus = (Gpu("d", "b300", GpuState.DRAINING), Gpu("g1", "b300"), Gpu("g2", "b300"))
    sessions = tuple(Session(f"d{k}", 10**8, gpu_id="d") for k in range(4))
    sessions += tuple(Session(f"{g}s{k}", 10**8, gpu_id=g) for g in ("g1", "g2") for k in range(24))
    snap = Snapshot(0.0, gpus, sessions)
    moved = {}
    for slo in (None, Slo()):
        policy = TurboServe(model=PAPER, autoscale=False, slo=slo)
        cmds = policy.decide(snap, None, policy.initial_state()).commands
        moved[slo is not None] = {c.session_id for c in cmds if isinstance(c, Migrate) and c.src == "d"}
    assert PAPER["b300"].latency(24) + PAPER["b300"].latency(25) > TurboServe().rebalance.max_transient_s
    assert moved == {False: set(), True: {"d0", "d1", "d2", "d3"}}


def test_an_overdue_drained_gpu_sheds_sessions_past_the_drain_bound():
    """A drained GPU's 8 GB session moves in 0.34 s, past the 0.2 s a drain sheds: it stays,
    unless the GPU is overdue, when it moves (the transient limit still holds the move)."""
    cfg = replace(TURBOSERVE_REBALANCE, max_transient_s=3.0)
    gpus = (Gpu("d", "b300", GpuState.DRAINING), Gpu("g1", "b300"))
    snap = Snapshot(0.0, gpus, (Session("big", 8 * 10**9, gpu_id="d"), Session("small", 10**8, gpu_id="d")))
    assert cfg.kappa(8 * 10**9) > cfg.drain_max_kappa_s >= cfg.kappa(10**8)
    for overdue, want in ((frozenset(), {"small"}), (frozenset({"d"}), {"small", "big"}), (frozenset({"g1"}), {"small"})):
        plan = plan_placement(snap, PAPER, cfg, overdue=overdue)
        assert {c.session_id for c in plan.commands if isinstance(c, Migrate) and c.src == "d"} == want
    tight = replace(cfg, max_transient_s=cfg.kappa(8 * 10**9))  # no room for its next chunk: it stays
    plan = plan_placement(snap, PAPER, tight, overdue=frozenset({"d"}))
    assert {c.session_id for c in plan.commands if isinstance(c, Migrate)} == {"small"}


def test_with_an_slo_a_gpu_drained_five_minutes_sheds_what_the_drain_bound_kept():
    """turboserve remembers when each GPU started draining; with an SLO, a GPU drained for
    ``drain_wait_s`` moves its heavy session too; without one it keeps it. The times travel in
    the state a control leader persists."""
    from processors.autoscaler import Slo
    from processors.policy_state import decode, encode
    from processors.turboserve import TurboServe

    gpus = (Gpu("d", "b300", GpuState.DRAINING), Gpu("g1", "b300"))
    sessions = (Session("big", 8 * 10**9, gpu_id="d"),)
    for slo, late in ((None, set()), (Slo(), {"big"})):
        policy = TurboServe(model=PAPER, autoscale=False, slo=slo)
        state = policy.initial_state()
        for now, want in ((10.0, set()), (309.0, set()), (310.0, late)):
            d = policy.decide(Snapshot(now, gpus, sessions), None, state)
            assert {c.session_id for c in d.commands if isinstance(c, Migrate)} == want, (slo, now)
            assert d.state.draining == (("d", 10.0),)
            state = decode(policy.initial_state(), encode(d.state))
            assert state == d.state
    ready = TurboServe(model=PAPER, autoscale=False, slo=Slo()).decide(Snapshot(320.0, (Gpu("g1", "b300"),), ()), None, state)
    assert ready.state.draining == ()  # a GPU no longer draining is forgotten


def test_turboserve_takes_a_draining_gpu_back_for_a_rise_and_places_onto_it_in_the_same_round():
    """A rise past the pool: the draining GPU that still holds a session is reinstated (no
    boot for its slots), the placement evacuates nothing from it and admits sessions to it, and
    no Retire goes with it."""
    from processors.decisions import Admit, Boot, Reinstate, Retire
    from processors.turboserve import TurboServe

    k = PAPER["b300"].capacity
    gpus = (Gpu("d", "b300", GpuState.DRAINING), Gpu("g1", "b300"), Gpu("g2", "b300"))
    sessions = ((Session("stays", gpu_id="d"),) + tuple(Session(f"r{i}", gpu_id="g1") for i in range(k))
                + tuple(Session(f"w{i}") for i in range(k // 2)))  # waiting for a GPU
    d = TurboServe(model=PAPER).decide(Snapshot(100.0, gpus, sessions), None, TurboServe(model=PAPER).initial_state())
    assert Reinstate("d") in d.commands
    assert not any(isinstance(c, (Migrate, Retire)) and getattr(c, "src", getattr(c, "gpu_id", None)) == "d" for c in d.commands)
    (admit,) = [c for c in d.commands if isinstance(c, Admit)]
    assert "d" in {gid for gid, _ in admit.order} and d.state.draining == ()
    boots = sum(c.count for c in d.commands if isinstance(c, Boot))
    calm = TurboServe(model=PAPER).decide(Snapshot(100.0, gpus[1:], sessions[1:]), None, TurboServe(model=PAPER).initial_state())
    assert boots == max(0, sum(c.count for c in calm.commands if isinstance(c, Boot)) - 1)  # one boot fewer
