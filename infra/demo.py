"""The demo: an autoscaled fleet serving a generated trace, replayed with time compressed.

The generated trace's load rises and then falls (:func:`infra.sim.tracegen.fall`). Starts
the processors (dispatch, detector, control, metrics) and the provisioner as child
processes; the control processor scales workers out, then in once the load has fallen:
it drains workers, moves the sessions they still hold off at chunk boundaries
(``Handoff``) and shuts them down once empty. Sessions go idle (offloaded to Redis) and
come back (restored). At the end the topics are read back and audited, and a report folder
gets the summary JSON and a timeline plot.
"""

from __future__ import annotations

import json
import re
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from processors.lifecycle import EventKind
from schemas.records import (ChunkDone, Claimed, CostTick, DeadLetter, Drain, InputAccepted,
                             Record, Reinstate, Released, ScaleOut, ScalingDecision, Shutdown, WorkerDown,
                             WorkerUp)
from schemas.topics import DEAD_LETTERS, METRICS, SCALING_COMMANDS, WORKER_EVENTS
from streams.client import SessionClient
from streams.config import Settings
from streams.kafka import RecordProducer
from streams.topics import ensure_topics

from .chaos import audit_chunks, audit_inputs, lost_inputs, refused_inputs
from .flow import EventLog
from .local import LocalFleet

__all__ = ["DemoConfig", "run_demo", "summarize", "plot_timeline"]


@dataclass(frozen=True)
class DemoConfig:
    """Wall-clock length, the trace behind it and the fleet's bounds."""

    duration_s: float = 90.0
    speed: float = 10.0  # trace seconds per wall second
    sessions: int = 60  # expected sessions in the trace
    level: int = 5
    seed: int = 0
    min_workers: int = 1
    max_workers: int = 4
    capacity: int = 8
    chunk_interval_s: float = 0.1
    trace: str | None = None  # a trace file to replay instead of a generated one
    fall_at: float | None = 0.55  # share of the generated trace after which its load falls (None: no fall)
    fall_keep: int = 4  # sessions that run on after the fall: one worker's worth at u* 0.5 (K 8)
    # the burst reserve's memory: its default (900 s) is ten times this run, and would hold
    # the pool at the opening burst's size to the end; off, as in the scale-in tests
    burst_memory_s: float = 0.0
    policy: str = "turboserve"  # the control processor's (a built-in or module:Name)


# the settings of a generated trace (a trace file's run takes its own length and load)
_GENERATED = ("duration_s", "sessions", "level", "seed", "fall_at", "fall_keep")


def _trace(cfg: DemoConfig) -> list[Any]:
    from infra.sim.trace import load_trace
    from infra.sim.tracegen import GenConfig, fall, generate

    if cfg.trace is not None:
        return list(load_trace(cfg.trace).events)
    trace_s = cfg.duration_s * cfg.speed * 0.8  # leave the last fifth of the run to drain
    events = generate(GenConfig(level=cfg.level, duration_s=trace_s, sessions=cfg.sessions,
                                seed=cfg.seed, life_median_s=120.0, state_median_mb=8.0))
    if cfg.fall_at is None:
        return events
    # the closes spread over 2 s of wall time; what is left runs to the end of the trace
    return fall(events, cfg.fall_at * trace_s, cfg.fall_keep, trace_s, over_s=2.0 * cfg.speed)


_SCALE_WORDS = {Drain: "drain", Reinstate: "reinstate", Shutdown: "shutdown"}


def scale_log(records: list[Record], t0: float) -> list[str]:
    """What the fleet did, in order: each scaling command, decision, worker change and
    migration, as ``"<seconds since t0> <what>"`` (the decisions carry u_max, u* and the
    level; a migration names the session and its source and target workers)."""
    out: list[tuple[float, str]] = []
    for r in records:
        if isinstance(r, Released) and r.reason == "migrated":
            target = r.successor.worker_id if r.successor is not None else "?"
            out.append((r.ts, f"migrate {r.session_id} {r.worker_id}->{target}"))
        elif isinstance(r, ScaleOut):
            out.append((r.ts, f"scale-out {r.count}"))
        elif isinstance(r, (Drain, Reinstate, Shutdown)):
            out.append((r.ts, f"{_SCALE_WORDS[type(r)]} {r.worker_id}"))
        elif isinstance(r, WorkerUp):
            out.append((r.ts, f"up {r.worker_id}"))
        elif isinstance(r, WorkerDown):  # said by the worker and by whoever saw it go: each names why
            out.append((r.ts, f"down {r.worker_id} ({r.reason})"))
        elif isinstance(r, ScalingDecision):
            out.append((r.ts, f"decision {r.reason} {r.current}->{r.target} u_max {r.u_max:.2f} "
                              f"u* {r.u_target:.2f} level {r.level}"))
    return [f"{ts - t0:.1f} {what}" for ts, what in sorted(out)]


def summarize(records: list[Record], pushed: dict[str, int], sessions: int, wall_s: float,
              t0: float = 0.0) -> dict[str, Any]:
    """The demo's figures and its ownership audit, from what the topics recorded; ``t0`` is
    when the trace's replay began (the scale log counts from it)."""
    chunks = [r for r in records if isinstance(r, ChunkDone)]
    lat = sorted(c.latency_s * 1000 for c in chunks) or [0.0]
    released = [r for r in records if isinstance(r, Released)]
    costs = [r for r in records if isinstance(r, CostTick)]
    refused = refused_inputs([r for r in records if isinstance(r, DeadLetter)])
    accepted = [r for r in records if isinstance(r, InputAccepted)]
    ups = {r.worker_id for r in records if isinstance(r, WorkerUp)}
    return {
        "sessions": sessions,
        "chunks": len(chunks),
        "chunk_latency_ms": {"p50": round(statistics.median(lat), 2),
                             "p99": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
                             "worst": round(lat[-1], 2)},
        "workers_started": len(ups),
        "migrations": sum(1 for r in released if r.reason == "migrated"),
        "drain_migrations": drain_migrations(records),
        "offloads": sum(1 for r in released if r.reason == "suspended"),
        "restores": sum(1 for r in records if isinstance(r, Claimed) and r.generation.epoch > 1),
        "scale_events": {"scale_out": sum(r.count for r in records if isinstance(r, ScaleOut)),
                         "drain": sum(1 for r in records if isinstance(r, Drain)),
                         "reinstate": sum(1 for r in records if isinstance(r, Reinstate)),
                         "shutdown": len({r.worker_id for r in records if isinstance(r, Shutdown)})},
        "cost": round(costs[-1].cost, 4) if costs else 0.0,
        "dead_letters": sum(1 for r in records if isinstance(r, DeadLetter)),
        "dead_letter_reasons": dead_letter_reasons(records),
        "dead_letter_examples": dead_letter_examples(records),
        "audit": {**audit_chunks(chunks), **audit_inputs(pushed, accepted, refused)},
        "inputs_refused": len(refused),
        "inputs_lost": [f"{sid}#{seq}" for sid, seq in lost_inputs(pushed, accepted, refused)[:20]],  # the first 20
        "wall_s": round(wall_s, 1),
        "scale_log": scale_log(records, t0),
    }


def drain_migrations(records: list[Record]) -> int:
    """Migrations off a worker while the control processor had it drained (from a Drain until
    a Reinstate takes it back)."""
    marks = sorted((r.ts, isinstance(r, Drain), r.worker_id) for r in records if isinstance(r, (Drain, Reinstate)))
    moves = sorted((r.ts, r.worker_id) for r in records if isinstance(r, Released) and r.reason == "migrated")
    drained: set[str] = set()
    count, i = 0, 0
    for ts, wid in moves:
        while i < len(marks) and marks[i][0] <= ts:
            (drained.add if marks[i][1] else drained.discard)(marks[i][2])
            i += 1
        count += wid in drained
    return count


def _folded(reason: str) -> str:
    # the reason up to its first detail in brackets (which worker refused it, and why, is the
    # example's to show), with quoted words, numbers and words with a digit in them (ids such
    # as s000050, default-3) folded
    return re.sub(r"'[^']*'|\b[\w.-]*\d[\w.-]*\b", "N", reason.split(" (", 1)[0])[:120]


def dead_letter_reasons(records: list[Record]) -> dict[str, int]:
    """Dead letters by reason, numbers and ids folded (``input N``), most frequent first."""
    reasons = Counter(_folded(r.reason) for r in records if isinstance(r, DeadLetter))
    return dict(reasons.most_common())


def dead_letter_examples(records: list[Record]) -> dict[str, str]:
    """Per folded reason, the first dead letter's reason as written (its ids and numbers)."""
    out: dict[str, str] = {}
    for r in records:
        if isinstance(r, DeadLetter):
            out.setdefault(_folded(r.reason), r.reason[:240])
    return out


def plot_timeline(records: list[Record], active: list[tuple[float, int]], t0: float, path: Path,
                  window_s: float = 2.0) -> None:
    """Four panels over wall time: workers up (drains marked), active sessions, migrations
    per window and the worst chunk latency per window."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    up: list[tuple[float, int]] = []
    alive: set[str] = set()
    for r in sorted((r for r in records if isinstance(r, (WorkerUp, WorkerDown))), key=lambda r: r.ts):
        (alive.add if isinstance(r, WorkerUp) else alive.discard)(r.worker_id)
        up.append((r.ts - t0, len(alive)))
    migr: dict[int, int] = defaultdict(int)
    worst: dict[int, float] = defaultdict(float)
    for r in records:
        if isinstance(r, Released) and r.reason == "migrated":
            migr[int((r.ts - t0) // window_s)] += 1
        elif isinstance(r, ChunkDone):
            k = int((r.ts - t0) // window_s)
            worst[k] = max(worst[k], r.latency_s * 1000)
    if up and active:  # hold the last worker count to the end of the run
        up.append((max(active[-1][0], up[-1][0]), up[-1][1]))
    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    axes[0].step([t for t, _ in up], [n for _, n in up], where="post")
    for i, ts in enumerate(sorted({r.ts for r in records if isinstance(r, Drain)})):
        axes[0].axvline(ts - t0, color="tab:purple", linestyle=":", label="drain" if i == 0 else None)
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="upper right")
    axes[0].set_ylabel("workers up")
    axes[1].step([t for t, _ in active], [n for _, n in active], where="post", color="tab:green")
    axes[1].set_ylabel("active sessions")
    axes[2].bar([k * window_s for k in migr], list(migr.values()), width=window_s, color="tab:orange")
    axes[2].set_ylabel(f"migrations / {window_s:g}s")
    axes[2].set_ylim(0, max(migr.values(), default=0) + 1)  # a count: no negative axis when there are none
    axes[3].plot([k * window_s for k in sorted(worst)], [worst[k] for k in sorted(worst)], color="tab:red")
    axes[3].set_ylabel("worst chunk ms")
    axes[3].set_xlabel("seconds since the first session")
    fig.suptitle("chunkserve demo timeline")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


async def run_demo(settings: Settings, cfg: DemoConfig, log_dir: Path, report_dir: Path,
                   on_tick: Callable[[dict[str, Any]], None] = lambda _s: None) -> dict[str, Any]:
    """Run the demo; returns the summary (also written to ``report_dir/summary.json``)."""
    started = time.monotonic()
    events = _trace(cfg)
    await ensure_topics(settings)
    fleet = LocalFleet(settings, log_dir, extra_env={
        "CHUNKSERVE_POLICY": cfg.policy, "CHUNKSERVE_PROFILE": "reference-cpu",
        "CHUNKSERVE_MIN_WORKERS": str(cfg.min_workers), "CHUNKSERVE_MAX_WORKERS": str(cfg.max_workers),
        "CHUNKSERVE_BOOT_S": "6", "CHUNKSERVE_SCALE_DWELL_S": "8", "CHUNKSERVE_CONTROL_PERIOD_S": "1",
        "CHUNKSERVE_HEARTBEAT_TIMEOUT_S": "8", "CHUNKSERVE_WORKER_CAPACITY": str(cfg.capacity),
        "CHUNKSERVE_BURST_MEMORY_S": f"{cfg.burst_memory_s:g}",
        "CHUNKSERVE_LOG_DIR": str(log_dir), "CHUNKSERVE_COST_INTERVAL_S": "2"})
    pushed: dict[str, int] = defaultdict(int)
    active_series: list[tuple[float, int]] = []
    try:
        for name in ("dispatch", "detector", "control", "metrics"):
            fleet.start_processor(name)
        fleet.start_provisioner()
        async with (RecordProducer(settings, client_id="demo") as producer, SessionClient(settings) as client,
                    EventLog(settings, producer, topics=(WORKER_EVENTS, METRICS, DEAD_LETTERS, SCALING_COMMANDS)) as log):
            await producer.send(ScaleOut(pool="default", count=cfg.min_workers, ts=time.time(),
                                         gpu_type="cpu", decision_id="demo-initial"))
            on_tick({"phase": "booting the first worker"})
            await log.until(lambda rs: any(isinstance(r, WorkerUp) for r in rs), 120, "the first worker")
            t0 = time.time()
            begin = time.monotonic()
            active: set[str] = set()
            shown = 0.0
            for ev in events:
                due = begin + ev.t / cfg.speed
                while time.monotonic() < due:
                    await log.pump(timeout_ms=int(min(100, max(1, (due - time.monotonic()) * 1000))))
                    if time.monotonic() - shown > 0.5:
                        shown = time.monotonic()
                        on_tick(_live(log.records, len(active), shown - begin, ev.t))
                sid = ev.session_id
                if ev.kind is EventKind.OPEN:
                    await client.open(sid, prompt=f"a paper boat, take {sid}", state_bytes=ev.state_bytes)
                    active.add(sid)
                elif ev.kind is EventKind.ACTIVE:
                    await client.active(sid)
                    active.add(sid)
                    pushed[sid] = await client.push(sid, f"steer {pushed[sid] + 1}")
                elif ev.kind is EventKind.IDLE:
                    await client.idle(sid)
                    active.discard(sid)
                else:
                    await client.close(sid)
                    active.discard(sid)
                active_series.append((time.time() - t0, len(active)))
            on_tick({"phase": "draining"})
            try:
                await log.until(lambda rs: audit_inputs(
                    pushed, [r for r in rs if isinstance(r, InputAccepted)],
                    refused_inputs([r for r in rs if isinstance(r, DeadLetter)]))["inputs_lost"] == 0,
                    30, "inputs to be applied")
            except Exception:
                pass  # reported as lost in the audit
            await log.pump(timeout_ms=1000)
        summary = summarize(log.records, dict(pushed), len({e.session_id for e in events}),
                            time.monotonic() - started, t0)
        report_dir.mkdir(parents=True, exist_ok=True)
        config = asdict(cfg)
        if cfg.trace is not None:  # what shapes a generated trace does not apply to a trace file
            for key in _GENERATED:
                config.pop(key, None)
        (report_dir / "summary.json").write_text(json.dumps({**summary, "config": config}, indent=2))
        plot_timeline(log.records, active_series, t0, report_dir / "timeline.png")
        return summary
    finally:
        fleet.stop_all()


def _live(records: list[Record], active: int, wall_s: float, trace_s: float) -> dict[str, Any]:
    up, down = set(), set()
    chunks, worst = 0, 0.0
    for r in records:
        if isinstance(r, WorkerUp):
            up.add(r.worker_id)
        elif isinstance(r, WorkerDown):
            down.add(r.worker_id)
        elif isinstance(r, ChunkDone):
            chunks += 1
            worst = max(worst, r.latency_s)
    return {"phase": "replaying the trace", "wall_s": round(wall_s, 1), "trace_s": round(trace_s),
            "active": active, "workers": len(up - down), "chunks": chunks,
            "worst_ms": round(worst * 1000, 1),
            "migrations": sum(1 for r in records if isinstance(r, Released) and r.reason == "migrated"),
            "offloads": sum(1 for r in records if isinstance(r, Released) and r.reason == "suspended")}
