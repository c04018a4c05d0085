"""The shipped placement equals the exhaustive oracle on every curve family, and the oracle
equals a brute force over every assignment of sessions to GPUs (transient limit, move budget
and the send-or-receive rule included)."""

import itertools
import math
import random
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infra.bench.scheduler import FAMILIES, SETTINGS, small_instance
from processors.decisions import Migrate, Place, Restore
from processors.latency import GpuProfile, LatencyModel
from processors.lifecycle import SessionState
from processors.oracles import exhaustive_placement, plan_objective
from processors.placement import RebalanceConfig, plan_placement
from processors.snapshot import Gpu, Session, Snapshot

SHAPES = ("flat-step", "concave", "convex", "crossing", "linear")


@st.composite
def curves(draw, shape: str, name: str, cap: int, steep: bool = False) -> GpuProfile:
    """l(1..cap) as a start plus increments shaped by the family."""
    first = draw(st.sampled_from([0.05, 0.1, 0.2] if steep else [0.3, 0.45, 0.6]))
    steps = [0.0, 0.0, 0.0, 0.12, 0.35] if shape == "flat-step" else ([0.15, 0.25, 0.4] if steep else [0.02, 0.05, 0.1])
    inc = draw(st.lists(st.sampled_from(steps), min_size=cap - 1, max_size=cap - 1))
    if shape == "concave":
        inc.sort(reverse=True)
    elif shape == "convex":
        inc.sort()
    pts, lat = [], first
    for n in range(1, cap + 1):
        pts.append((n, round(lat, 6)))
        lat += inc[n - 1] if n - 1 < len(inc) else 0.0
    return GpuProfile(name, cap, 1.0, tuple(pts))


@st.composite
def instances(draw, max_gpus: int, max_sessions: int):
    """A family's pool, a skewed (or not) previous placement, arrivals and rebalance settings."""
    family = draw(st.sampled_from(SHAPES))
    if family == "crossing":  # a type fast at low load against a flat one: the curves cross
        model = LatencyModel({
            "steep": draw(curves(draw(st.sampled_from(["linear", "convex"])), "steep", draw(st.integers(2, 4)), steep=True)),
            "flat": draw(curves(draw(st.sampled_from(["linear", "concave"])), "flat", draw(st.integers(3, 5)))),
        })
    else:
        model = LatencyModel({t: draw(curves(family, t, draw(st.integers(2, 5)))) for t in ("a", "b")})
    m = draw(st.integers(2, max_gpus))
    gpus = tuple(Gpu(f"g{i}", draw(st.sampled_from(sorted(model)))) for i in range(m))
    skewed = draw(st.booleans())
    sessions = []
    for i, g in enumerate(gpus):
        cap = model[g.type].capacity
        n = draw(st.integers(cap // 2 if skewed and i == 0 else 0, cap if not skewed or i == 0 else 1))
        for _ in range(n):
            if len(sessions) < max_sessions:
                sessions.append(Session(f"s{len(sessions)}", draw(st.sampled_from([0, 1 << 28, 3 << 30, 10**10, 2 * 10**10])), gpu_id=g.id))
    for _ in range(draw(st.integers(0, 2))):
        if len(sessions) < max_sessions + 1:
            sessions.append(Session(f"s{len(sessions)}", 1 << 20))
    cfg = RebalanceConfig(
        eta=draw(st.sampled_from([0.0, 0.1, 1.0])),
        alpha_s=draw(st.sampled_from([0.0, 0.02])),
        max_moves=draw(st.sampled_from([0, 1, 2, 100])),
        max_transient_s=draw(st.sampled_from([math.inf, 0.6, 0.9, 1.2, 1.6])),
    )
    return Snapshot(0.0, gpus, tuple(sessions)), model, cfg


def _brute_force(snap, model, cfg):
    """Every assignment of every executing session to a GPU (a waiting one may stay out)."""
    gpus = sorted(snap.gpus, key=lambda g: g.id)
    ids = [g.id for g in gpus]
    execs = [s for s in snap.sessions if s.lifecycle is SessionState.EXECUTION]
    have = [sum(s.gpu_id == g for s in execs) for g in ids]
    cap = [model[g.type].capacity for g in gpus]
    lat = [model[g.type].latency for g in gpus]
    waiting = sum(s.gpu_id is None for s in execs)
    placed = min(waiting, sum(max(0, c - h) for c, h in zip(cap, have)))
    options = [range(len(gpus)) if s.gpu_id is not None else range(-1, len(gpus)) for s in execs]
    best = math.inf
    for choice in itertools.product(*options):
        if sum(1 for s, j in zip(execs, choice) if s.gpu_id is None and j >= 0) != placed:
            continue
        n = [0] * len(gpus)
        sends, gets = set(), set()
        landing = defaultdict(list)
        cost, moves = 0.0, 0
        for s, j in zip(execs, choice):
            if j < 0:
                continue
            n[j] += 1
            if s.gpu_id is None:
                gets.add(j)
            elif s.gpu_id != ids[j]:
                sends.add(ids.index(s.gpu_id))
                gets.add(j)
                landing[j].append(cfg.kappa(s.state_bytes))
                cost += cfg.kappa(s.state_bytes)
                moves += 1
        if moves > cfg.max_moves or sends & gets or any(n[j] > cap[j] for j in gets):
            continue
        if not all(any(all(cfg.transient(k, lat[j](have[j] + r), lat[j](have[j] + r + 1)) <= cfg.max_transient_s
                           for r, k in enumerate(order))
                       for order in itertools.permutations(ks))
                   for j, ks in landing.items()):
            continue
        best = min(best, max(lat[j](n[j]) for j in range(len(gpus))) + cfg.eta * cost)
    return best


def _check_plan(snap, model, cfg, plan):
    """The plan keeps the budget, the send-or-receive rule, K and the transient limit (moves
    onto a GPU landing largest kappa first, ahead of its new sessions)."""
    moves = [c for c in plan.commands if isinstance(c, Migrate)]
    assert len(moves) <= cfg.max_moves
    gets = {c.dst for c in moves} | {c.gpu_id for c in plan.commands if isinstance(c, (Place, Restore))}
    assert not gets & {c.src for c in moves}
    types = {g.id: g.type for g in snap.gpus}
    before = snap.loads()
    for gid in gets:
        assert plan.loads[gid] <= model[types[gid]].capacity
        ks = sorted((c.cost_s for c in moves if c.dst == gid), reverse=True)
        lat = model[types[gid]].latency
        for r, k in enumerate(ks):
            assert cfg.transient(k, lat(before[gid] + r), lat(before[gid] + r + 1)) <= cfg.max_transient_s + 1e-12


@settings(max_examples=150, deadline=None)
@given(instances(max_gpus=3, max_sessions=6))
def test_oracle_and_placement_match_assignment_brute_force(inst):
    snap, model, cfg = inst
    brute = _brute_force(snap, model, cfg)
    assert exhaustive_placement(snap, model, cfg).objective == pytest.approx(brute, abs=1e-9)
    plan = plan_placement(snap, model, cfg)
    _check_plan(snap, model, cfg, plan)
    assert plan_objective(plan, cfg) == pytest.approx(brute, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(instances(max_gpus=5, max_sessions=18))
def test_placement_equals_oracle_on_every_family(inst):
    snap, model, cfg = inst
    plan = plan_placement(snap, model, cfg)
    _check_plan(snap, model, cfg, plan)
    assert plan_objective(plan, cfg) == pytest.approx(exhaustive_placement(snap, model, cfg).objective, abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(FAMILIES), st.sampled_from(sorted(SETTINGS)), st.integers(0, 2**32))
def test_benchmark_families_are_solved_exactly(family, setting, seed):
    snap, model = small_instance(random.Random(seed), family)
    cfg = SETTINGS[setting]
    plan = plan_placement(snap, model, cfg)
    _check_plan(snap, model, cfg, plan)
    assert plan_objective(plan, cfg) == pytest.approx(exhaustive_placement(snap, model, cfg).objective, abs=1e-9)


def test_two_moves_across_a_flat_step():
    # padded buckets: l(3) = l(4), so one move off the hot GPU gains nothing and two do
    flat = GpuProfile("p", 4, 1.0, ((1, 0.3), (2, 0.5), (3, 1.0), (4, 1.0)))
    model = LatencyModel({"p": flat})
    gpus = (Gpu("g0", "p"), Gpu("g1", "p"))
    sessions = tuple(Session(f"s{i}", 0, gpu_id="g0") for i in range(4))
    cfg = RebalanceConfig(eta=1.0, alpha_s=0.02)
    plan = plan_placement(Snapshot(0.0, gpus, sessions), model, cfg)
    assert plan.loads == {"g0": 2, "g1": 2}
    assert plan_objective(plan, cfg) == pytest.approx(0.5 + 2 * 0.02)


def test_moves_land_largest_first_within_the_transient_limit():
    # landing on the empty GPU: position 1 costs kappa + 0.3, position 2 kappa + 0.9 (limit 1.0).
    # Shedding the two cheapest (0.02 s and 0.3 s) fits only with the 0.3 s move landing first.
    model = LatencyModel({"p": GpuProfile("p", 6, 1.0, ((1, 0.3), (2, 0.6), (3, 0.9), (4, 1.2)))})
    gpus = (Gpu("g0", "p"), Gpu("g1", "p"))
    sessions = (Session("small", 0, gpu_id="g0"), Session("mid", 7 * 10**9, gpu_id="g0"),
                Session("x0", 10**10, gpu_id="g0"), Session("x1", 10**10, gpu_id="g0"))
    snap = Snapshot(0.0, gpus, sessions)
    cfg = RebalanceConfig(eta=0.1, max_transient_s=1.0)
    plan = plan_placement(snap, model, cfg)
    assert [c.session_id for c in plan.commands] == ["mid", "small"]
    assert plan.loads == {"g0": 2, "g1": 2}
    assert plan_objective(plan, cfg) == pytest.approx(0.6 + 0.1 * (0.02 + 0.3))
    assert exhaustive_placement(snap, model, cfg).objective == pytest.approx(plan_objective(plan, cfg))
