"""Worker benchmark: chunk latency by batch size, coalescing speedup, state size, offload and
restore through Redis, and migration time from freeze to the target's first chunk.

Offload, restore and migration go through the real generation store (fenced snapshot writes
in bounded parts, manifest with sha256) on the Redis given; source and target models are two
instances of one model in this process (the reference model, or a model of your own named
``module:Name``), so the Kafka command hop is not included (the control-plane benchmark
measures that).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import msgpack

__all__ = ["run", "write_profile"]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def _speedup(model: Any, rounds: int) -> float:
    """Median over rounds of (8 single-session chunks) / (one batch of 8), same work."""
    singles = [model.init_state(f"single-{i}", "speedup", seed=i) for i in range(8)]
    batch = [model.init_state(f"batch-{i}", "speedup", seed=i) for i in range(8)]
    ratios = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for s in singles:
            model.run_batch([s])
        t1 = time.perf_counter()
        model.run_batch(batch)
        t2 = time.perf_counter()
        ratios.append((t1 - t0) / (t2 - t1))
    return statistics.median(ratios)


def run(redis_url: str, sessions: int = 32, migrations: int = 40, repeats: int = 12,
        model: str | None = None, device: str = "cpu") -> dict[str, Any]:
    """The benchmark result (see module docstring); ``redis_url`` must be a real Redis;
    ``model`` a model of your own (``module:Name``; None: the reference model)."""
    import torch

    from streams.generations import SyncGenerationStore
    from workers.model import profile_latency
    from workers.model_plugin import load_model

    torch.manual_seed(0)
    source_model = load_model(model, device)
    target_model = load_model(model, device)
    config = getattr(source_model, "config", None)  # the reference model's: its context window
    warm_chunks = config.context_frames // config.frames_per_chunk if config is not None else 4
    latency = profile_latency(source_model, list(range(1, 17)), repeats=repeats, warmup=3)
    speedup = _speedup(source_model, rounds=repeats)

    ns = f"bench-{uuid.uuid4().hex[:8]}"
    store = SyncGenerationStore.from_url(redis_url, ns)
    try:
        store.register_worker("src", sessions + migrations)
        store.register_worker("dst", sessions + migrations)
        states, gens = [], []
        for i in range(sessions):
            st = source_model.init_state(f"s{i}", f"prompt {i}", seed=i)
            for _ in range(warm_chunks):
                source_model.run_batch([st])  # fill the context window
            gen = store.commit(st.session_id, 0, "src")
            store.claim(st.session_id, gen)
            states.append(st)
            gens.append(gen)
        state_bytes = len(msgpack.packb(source_model.export_state(states[0]), use_bin_type=True))

        t0 = time.perf_counter()
        total = 0
        for st, gen in zip(states, gens):
            blob = msgpack.packb(source_model.export_state(st), use_bin_type=True)
            store.put_snapshot(st.session_id, gen, blob, chunk_index=st.chunk_index, input_seq=st.input_seq)
            total += len(blob)
        offload_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for st in states:
            _, blob = store.read_snapshot(st.session_id)
            target_model.import_state(msgpack.unpackb(blob, raw=False))
        restore_s = time.perf_counter() - t0

        migration_ms = []
        for k in range(migrations):
            st, gen = states[k % sessions], gens[k % sessions]
            src_model, dst_model = ((source_model, target_model) if gen.worker_id == "src"
                                    else (target_model, source_model))
            dst = "dst" if gen.worker_id == "src" else "src"
            src_model.run_batch([st])  # the source finishes its current chunk, then freezes
            t0 = time.perf_counter()
            blob = msgpack.packb(src_model.export_state(st), use_bin_type=True)
            store.put_snapshot(st.session_id, gen, blob, chunk_index=st.chunk_index, input_seq=st.input_seq)
            _, data = store.read_snapshot(st.session_id)
            restored = dst_model.import_state(msgpack.unpackb(data, raw=False))
            new_gen = store.commit_migration(st.session_id, gen, dst)
            store.claim(st.session_id, new_gen)
            dst_model.run_batch([restored])
            migration_ms.append((time.perf_counter() - t0) * 1000)
            states[k % sessions], gens[k % sessions] = restored, new_gen
        for st, gen in zip(states, gens):
            store.release(st.session_id, gen, close=True)
    finally:
        store.client.close()

    mb = total / 1e6
    return {
        "model": model or "reference",
        "chunk_latency_s": {str(b): round(v, 6) for b, v in latency.items()},
        "coalesce_speedup_8": round(speedup, 3),
        "state_bytes": state_bytes,
        "offload_mb_s": round(mb / offload_s, 3),
        "restore_mb_s": round(mb / restore_s, 3),
        "migration_ms": {"median": round(statistics.median(migration_ms), 3),
                         "p99": round(_pct(migration_ms, 0.99), 3)},
        "migration_pct_of_chunk": round(100 * statistics.median(migration_ms) / 1000
                                        / latency[max(latency)], 2),
    }


def write_profile(result: dict[str, Any], path: Path, capacity: int = 16) -> None:
    """Write the measured latencies as a latency profile the decision core loads.

    A profile must be non-decreasing in batch size; measurement noise can break that, so each
    point is raised to the largest latency measured at a smaller batch.
    """
    latency: dict[str, float] = {}
    highest = 0.0
    for batch in sorted(result["chunk_latency_s"], key=int):
        highest = max(highest, result["chunk_latency_s"][batch])
        latency[batch] = highest
    doc = {
        "format": "chunkserve.latency-profile",
        "version": 1,
        "name": path.stem,
        "source": f"Measured by `chunkserve bench worker` from the worker model "
                  f"{result.get('model', 'reference')} (median seconds per coalesced chunk).",
        "gpu_types": {"cpu": {"capacity": capacity, "cost_per_hour": 0.10, "memory_gib": 24,
                              "latency_s": latency}},
    }
    path.write_text(json.dumps(doc, indent=2) + "\n")
