"""The simulator's hot decision helpers give what their plain definitions give: the
admission order is the heap walk over free positions it replaced (and one type's keys
walked level by level are that walk), and the snapshot's
per-GPU counts are the per-session loops."""

from __future__ import annotations

import heapq
import random

import pytest

from processors.latency import load_profiles
from processors.lifecycle import SessionState
from processors.placement import admission_order, free_positions
from processors.snapshot import Gpu, GpuState, Session, Snapshot

MODEL = load_profiles("paper")


def _heap_order(snapshot: Snapshot, loads: dict[str, int], limit: int) -> tuple[tuple[str, int], ...]:
    """Free positions of the ready GPUs popped least (l(n), n, id) first, one GPU's next
    position pushed after each pop."""
    heap, caps = [], {}
    for g in snapshot.gpus:
        p = MODEL[g.type]
        n = loads.get(g.id, 0) + 1
        if g.state is GpuState.READY and n <= p.capacity:
            caps[g.id] = p
            heap.append((p.latency(n), n, g.id))
    heapq.heapify(heap)
    out: list[tuple[str, int]] = []
    while heap and len(out) < limit:
        _, n, gid = heapq.heappop(heap)
        out.append((gid, n))
        if n < caps[gid].capacity:
            heapq.heappush(heap, (caps[gid].latency(n + 1), n + 1, gid))
    return tuple(out)


def _pool(rng: random.Random, mixed: bool) -> tuple[Gpu, ...]:
    ids = rng.sample(range(1000), rng.randint(0, 30))
    return tuple(Gpu(f"g{i:05d}", rng.choice(("b300", "h20")) if mixed else "b300", rng.choice(list(GpuState)))
                 for i in ids)


@pytest.mark.parametrize("seed", range(6))
def test_admission_order_is_the_heap_walk(seed):
    rng = random.Random(seed)
    for _ in range(300):
        gpus = _pool(rng, mixed=seed % 2 == 1)
        loads = {g.id: rng.randint(0, 45) for g in gpus if rng.random() < 0.9}
        snap = Snapshot(0.0, gpus, ())
        for limit in (0, 1, 7, 128, 2000):
            assert admission_order(snap, MODEL, loads, limit) == _heap_order(snap, loads, limit)


@pytest.mark.parametrize("seed", range(4))
def test_keys_shared_by_every_gpu_walk_as_the_heap_does_flat_steps_included(seed):
    """One type's keys go level by level; the same keys under two types take the heap:
    both give the same order, with runs of equal keys (flat steps) and keys that fall."""
    rng = random.Random(seed)
    for _ in range(400):
        k = rng.randint(1, 12)
        keys = [rng.choice((rng.randint(0, 4), rng.random())) for _ in range(k)]
        if rng.random() < 0.8:
            keys.sort()
        gpus = tuple(Gpu(g.id, "a", g.state) for g in _pool(rng, mixed=False))
        loads = {g.id: rng.randint(0, k + 2) for g in gpus if rng.random() < 0.9}
        split = tuple(Gpu(g.id, rng.choice("ab"), g.state) for g in gpus)
        for limit in (0, 1, 5, 40, 500):
            heap = free_positions(split, loads, {"a": keys, "b": list(keys)}, limit)
            assert free_positions(gpus, loads, {"a": keys}, limit) == heap


@pytest.mark.parametrize("seed", range(4))
def test_snapshot_counts_are_the_session_loops(seed):
    rng = random.Random(seed)
    gpus = _pool(rng, mixed=True)
    names = [g.id for g in gpus] + ["gone", None]
    sessions = tuple(Session(f"s{k}", 1, rng.choice(list(SessionState)), rng.choice(names)) for k in range(400))
    snap = Snapshot(0.0, gpus, sessions)
    resident = {g.id: sum(1 for s in sessions if s.gpu_id == g.id and s.lifecycle is not SessionState.TERMINATED)
                for g in gpus}
    loads = {g.id: sum(1 for s in sessions if s.gpu_id == g.id and s.lifecycle is SessionState.EXECUTION)
             for g in gpus}
    assert snap.resident() == resident
    assert snap.loads() == loads
