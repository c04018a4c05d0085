"""The shipped placement against an integer program solved by HiGHS (scipy), on pools larger
than the exhaustive oracle can take: 4-9 GPUs of up to 16 sessions, flat-step, concave,
convex and linear curves, two GPU types, skewed previous placements, arrivals, with and
without a move budget. The program knows nothing of levels or shedding: it assigns every
session to a GPU and pays eta * kappa for each that leaves its GPU."""

import math
import random

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import lil_matrix

from processors.latency import GpuProfile, LatencyModel
from processors.oracles import plan_objective
from processors.placement import RebalanceConfig, plan_placement
from processors.snapshot import Gpu, Session, Snapshot

SHAPES = ("flat-step", "concave", "convex", "linear")


def _curve(rng: random.Random, shape: str, name: str, cap: int) -> GpuProfile:
    """l(n) at a few points of 1..cap (linear between them), never decreasing."""
    def at(n: int) -> float:
        x = n / cap
        if shape == "flat-step":
            return 0.2 + 0.25 * math.ceil(n / step)
        if shape == "concave":
            return 0.1 + scale * math.sqrt(x)
        if shape == "convex":
            return 0.1 + scale * x * x
        return 0.3 + scale * x

    step, scale = rng.choice((2, 3, 4)), rng.uniform(0.4, 1.4)
    points = sorted(set(rng.sample(range(1, cap + 1), min(cap, rng.randint(2, 6))) + [cap]))
    if shape == "flat-step":  # both ends of every step, so the curve is flat between them
        points = sorted({p for n in range(1, cap + 1, step) for p in (n, min(cap, n + step - 1))})
    return GpuProfile(name, cap, 1.0, tuple((n, round(at(n), 6)) for n in points))


def _instance(rng: random.Random) -> tuple[Snapshot, LatencyModel, RebalanceConfig]:
    shape = rng.choice(SHAPES)
    model = LatencyModel({t: _curve(rng, shape if t == "a" else rng.choice(SHAPES), t, rng.randint(6, 16)) for t in ("a", "b")})
    gpus = tuple(Gpu(f"g{i}", rng.choice("ab")) for i in range(rng.randint(4, 9)))
    skewed, sessions = rng.random() < 0.4, []
    for i, g in enumerate(gpus):
        cap = model[g.type].capacity
        for _ in range(cap if skewed and i < 2 else rng.randint(0, 2 if skewed else cap)):
            sessions.append(Session(f"s{len(sessions)}", rng.randint(1, 8) << 30, gpu_id=g.id))
    room = sum(model[g.type].capacity for g in gpus) - len(sessions)
    for _ in range(rng.randint(0, min(6, room))):
        sessions.append(Session(f"s{len(sessions)}", rng.randint(1, 8) << 30))
    cfg = RebalanceConfig(eta=rng.choice((0.1, 0.3, 1.0, 3.0)), alpha_s=rng.choice((0.0, 0.02, 0.2)),
                          beta_s_per_byte=rng.choice((1e-11, 1e-10, 5e-10)),
                          max_moves=rng.choice((1 << 62, 1 << 62, 1, 3)), max_transient_s=math.inf)
    return Snapshot(0.0, gpus, tuple(sessions)), model, cfg


def _integer_program(snap: Snapshot, model: LatencyModel, cfg: RebalanceConfig) -> float:
    """min L + eta * sum(kappa of the sessions that leave their GPU), every session placed,
    at most ``max_moves`` leaving; x[i, j] session i on GPU j, y[j, n] GPU j holds n."""
    gpus, sessions = list(snap.gpus), list(snap.sessions)
    col = {g.id: j for j, g in enumerate(gpus)}
    caps = [model[g.type].capacity for g in gpus]
    nx, ny = len(sessions) * len(gpus), sum(k + 1 for k in caps)
    worst = nx + ny
    cost = np.zeros(worst + 1)
    cost[worst] = 1.0
    rows = lil_matrix((len(sessions) + 3 * len(gpus) + 1, worst + 1))
    lo, hi = [], []
    for i, s in enumerate(sessions):
        rows[len(lo), i * len(gpus):(i + 1) * len(gpus)] = 1  # placed once
        lo.append(1), hi.append(1)
    r = len(lo)  # sessions that leave their GPU: eta * kappa each, at most max_moves of them
    for i, s in enumerate(sessions):
        if s.gpu_id is not None:
            for j in range(len(gpus)):
                if j != col[s.gpu_id]:
                    cost[i * len(gpus) + j] = cfg.eta * (cfg.alpha_s + cfg.beta_s_per_byte * s.state_bytes)
                    rows[r, i * len(gpus) + j] = 1
    lo.append(0), hi.append(min(cfg.max_moves, len(sessions)))
    off = nx
    for j, g in enumerate(gpus):
        ns = range(caps[j] + 1)
        r = len(lo)
        for n in ns:
            rows[r, off + n] = 1
        lo.append(1), hi.append(1)
        for n in ns:
            rows[r + 1, off + n] = n
        for i in range(len(sessions)):
            rows[r + 1, i * len(gpus) + j] = -1
        lo.append(0), hi.append(0)
        for n in ns:
            rows[r + 2, off + n] = model[g.type].latency(n) if n else 0.0
        rows[r + 2, worst] = -1
        lo.append(-np.inf), hi.append(0)
        off += caps[j] + 1
    integral = np.ones(worst + 1)
    integral[worst] = 0
    res = milp(cost, constraints=LinearConstraint(rows.tocsr(), lo, hi), integrality=integral,
               bounds=Bounds(np.zeros(worst + 1), np.r_[np.ones(worst), np.inf]), options={"mip_rel_gap": 0.0})
    assert res.status == 0, res.message
    return res.fun


@pytest.mark.parametrize("seed", range(4))
def test_placement_equals_an_integer_program_on_larger_pools(seed):
    rng = random.Random(seed)
    for _ in range(12):
        snap, model, cfg = _instance(rng)
        plan = plan_placement(snap, model, cfg)
        assert not plan.unplaced
        assert plan_objective(plan, cfg) == pytest.approx(_integer_program(snap, model, cfg), rel=1e-7, abs=1e-9)
