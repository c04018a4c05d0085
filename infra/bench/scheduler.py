"""Scheduler benchmark: decision-epoch time on large pools, placement gap to the exhaustive oracle.

``run(gpus)`` times one full placement epoch (place the epoch's arrivals, evacuate, rebalance
to convergence) on pools of each size with 16 sessions per GPU on average and skewed loads,
and compares TurboServe's placement objective (L + eta * migration seconds) with the
exhaustive oracle's on small random instances (homogeneous and mixed GPU types).
"""

from __future__ import annotations

import gc
import random
import statistics
import time
from typing import Any

from processors.latency import LatencyModel, load_profiles
from processors.oracles import exhaustive_placement, plan_objective
from processors.placement import RebalanceConfig, plan_placement
from processors.snapshot import Gpu, Session, Snapshot

__all__ = ["run", "loaded_snapshot", "small_instance"]

_MB = 1 << 20


def loaded_snapshot(m: int, rng: random.Random, model: LatencyModel, gpu_type: str = "b300", mean: float = 16.0) -> Snapshot:
    """A pool of ``m`` GPUs holding ``mean`` sessions each on average, skewed (gamma weights,
    shape 2, so a long tail of hot GPUs), plus about m/8 arrivals waiting for a GPU."""
    cap = model[gpu_type].capacity
    gpus = tuple(Gpu(f"gpu-{i:05d}", gpu_type) for i in range(m))
    sessions: list[Session] = []
    for g in gpus:
        n = min(cap, int(round(rng.gammavariate(2.0, mean / 2.0))))
        sessions.extend(Session(f"s{len(sessions)}", rng.randint(50, 2000) * _MB, gpu_id=g.id) for _ in range(n))
    sessions.extend(Session(f"s{len(sessions)}", rng.randint(50, 2000) * _MB) for _ in range(max(1, m // 8)))
    return Snapshot(0.0, gpus, tuple(sessions))


def small_instance(rng: random.Random, model: LatencyModel) -> Snapshot:
    """2-4 GPUs (sometimes mixed types), a skewed previous placement and a few arrivals."""
    m = rng.randint(2, 4)
    types = sorted(model)
    mixed = rng.random() < 0.5
    base = rng.choice(types)
    gpus = tuple(Gpu(f"g{i}", rng.choice(types) if mixed else base) for i in range(m))
    sessions: list[Session] = []
    for i, g in enumerate(gpus):
        cap = model[g.type].capacity
        hot = rng.random() < 0.4
        n = rng.randint(cap // 2, cap) if hot else rng.randint(0, cap // 2)
        sessions.extend(Session(f"s{len(sessions)}", rng.randint(50, 2000) * _MB, gpu_id=g.id) for _ in range(n))
    sessions.extend(Session(f"s{len(sessions)}", rng.randint(50, 2000) * _MB) for _ in range(rng.randint(0, 3)))
    return Snapshot(0.0, gpus, tuple(sessions))


def _epochs(sizes: list[int], rng: random.Random, model: LatencyModel, cfg: RebalanceConfig, reps: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for m in sizes:
        times, counts = [], []
        for _ in range(reps):
            snap = loaded_snapshot(m, rng, model)
            gc.collect()  # don't bill the generator's garbage to the decision
            t0 = time.perf_counter()
            plan_placement(snap, model, cfg)
            times.append((time.perf_counter() - t0) * 1e3)
            counts.append(len(snap.sessions))
        times.sort()
        out[str(m)] = {
            "sessions": int(statistics.median(counts)),
            "median_ms": round(statistics.median(times), 3),
            "p99_ms": round(times[min(len(times) - 1, int(0.99 * len(times)))], 3),
        }
    return out


def _gap(instances: int, rng: random.Random, model: LatencyModel, cfg: RebalanceConfig) -> dict[str, Any]:
    gaps = []
    for _ in range(instances):
        snap = small_instance(rng, model)
        ours = plan_objective(plan_placement(snap, model, cfg), cfg)
        best = exhaustive_placement(snap, model, cfg).objective
        gaps.append(max(0.0, (ours - best) / best * 100.0) if best > 0 else 0.0)
    return {
        "instances": instances,
        "mean_pct": round(statistics.fmean(gaps), 3) if gaps else 0.0,
        "max_pct": round(max(gaps), 3) if gaps else 0.0,
    }


def run(gpus: list[int], instances: int = 200, seed: int = 0, reps: int = 30) -> dict:
    """Benchmark result: {"epochs": {size: {sessions, median_ms, p99_ms}}, "oracle_gap": {...}}."""
    model = load_profiles("paper")
    cfg = RebalanceConfig(max_moves=1 << 30)  # to convergence
    rng = random.Random(seed)
    return {"epochs": _epochs(list(gpus), rng, model, cfg, reps), "oracle_gap": _gap(instances, rng, model, cfg)}
