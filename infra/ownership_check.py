"""Randomized ownership runs (DESIGN.md §3): four protocols through the same faulty schedules.

A schedule (drawn from a seed) holds one session, three workers and two dispatch replicas:
inputs arriving, workers paused past detection and resumed mid-chunk, crashes and restarts,
recoveries and migrations decided from a read and written a tick later (so replicas race),
and a network that delays, reorders and duplicates Assign / Revoke messages. Each protocol
runs every schedule:

- ``assignment``: the placement write alone confers authority; workers never check.
- ``claim-only``: a worker claims once when assigned (placement names it), never again.
- ``worker-id``: every release checks that the placement names this worker (no epoch).
- ``generation``: ours, on the real store code (``streams.generations``): commit CAS, claim,
  and each release is a fenced chunk-index write; most runs on the in-memory twin, a sample
  on a real Redis.

Ground truth: every change of owner opens a new "truth" epoch. The checker flags a run with a
dual-owner release (one chunk index released under two truth epochs) and a run with a stale
release (a runtime releasing while a newer truth epoch exists). ``run()`` drives
``runs // len(protocols)`` schedules through every protocol.
"""

from __future__ import annotations

import heapq
from abc import ABC, abstractmethod
import random
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from infra.ownership_replica import PlacementScripts, ReplicatedScripts, make_replica_plan
from schemas.errors import InfraError, OwnershipError
from schemas.records import Generation
from streams.generations import SyncGenerationStore
from streams.generations_memory import MemoryScripts, SyncMemoryGenerationStore

__all__ = ["PROTOCOLS", "STORES", "run", "make_schedule", "simulate"]

PROTOCOLS = ("assignment", "claim-only", "worker-id", "generation")
STORES = ("linearizable", "replica")
WORKERS = ("w1", "w2", "w3")
SID = "s"
DETECT = 2  # ticks without heartbeats before dispatch declares a worker down


def make_schedule(rng: random.Random) -> dict[str, Any]:
    """Events by tick, plus pre-drawn network behaviour (delay, duplicate delay or 0)."""
    ticks = rng.randint(8, 14)
    ev: dict[int, list[tuple[Any, ...]]] = {}

    def at(t: int, *e: Any) -> None:
        ev.setdefault(t, []).append(e)

    def decide(t: int, kind: str, failed: str | None, target: str) -> None:
        at(t, "decide", "D1", kind, failed, target, rng.randint(0, 1))
        if rng.random() < 0.35:  # the event reached both replicas: they race
            at(t, "decide", "D2", kind, failed, rng.choice(WORKERS), rng.randint(0, 1))

    first = rng.choice(WORKERS)
    decide(0, "open", None, first)
    for t in range(1, ticks):
        if rng.random() < 0.7:
            at(t, "input")
    for _ in range(rng.randint(1, 3)):
        kind = rng.random()
        w = first if rng.random() < 0.6 else rng.choice(WORKERS)
        t0 = rng.randint(1, ticks - 2)
        if kind < 0.45:
            dur = rng.randint(1, 7)
            at(t0, "pause", w)
            at(t0 + dur, "resume", w)
            if dur > DETECT:
                decide(t0 + DETECT, "recover", w, rng.choice([x for x in WORKERS if x != w]))
        elif kind < 0.65:
            at(t0, "crash", w)
            decide(t0 + DETECT, "recover", w, rng.choice([x for x in WORKERS if x != w]))
            if rng.random() < 0.5:
                at(t0 + rng.randint(1, 4), "restart", w)
        else:
            decide(t0, "migrate", None, rng.choice(WORKERS))
    net = [(rng.randint(1, 3), rng.randint(1, 5) if rng.random() < 0.15 else 0) for _ in range(24)]
    return {"ticks": ticks, "events": ev, "net": net, "size": sum(len(v) for v in ev.values())}


class _Runtime:
    __slots__ = ("truth", "epoch", "chunk")

    def __init__(self, truth: int, epoch: int, chunk: int) -> None:
        self.truth, self.epoch, self.chunk = truth, epoch, chunk


class _Sim(ABC):
    """Shared machinery; subclasses say how dispatch writes and how workers gate a release."""

    name = ""

    def __init__(self, schedule: dict[str, Any], trace: bool) -> None:
        self.s = schedule
        self.trace: list[str] | None = [] if trace else None
        self.t = 0
        self.net_i = 0
        self.seq = 0
        self.msgs: list[tuple[int, int, str, tuple[Any, ...]]] = []
        self.state = {w: "up" for w in WORKERS}
        self.inbox: dict[str, list[tuple[Any, ...]]] = {w: [] for w in WORKERS}
        self.rt: dict[str, _Runtime | None] = {w: None for w in WORKERS}
        self.truth = 0
        self.inputs = 0
        self.released: dict[int, int] = {}
        self.dual = self.stale = False
        self.pending: dict[int, list[tuple[Any, ...]]] = {}
        self.repl: ReplicatedScripts | None = None

    def log(self, text: str) -> None:
        if self.trace is not None:
            self.trace.append(f"t{self.t} {text}")

    def send(self, dest: str, msg: tuple[Any, ...]) -> None:
        delay, dup = self.s["net"][self.net_i % len(self.s["net"])]
        self.net_i += 1
        for d in (delay, dup) if dup else (delay,):
            self.seq += 1
            heapq.heappush(self.msgs, (self.t + d, self.seq, dest, msg))

    def release(self, w: str, rt: _Runtime) -> None:
        k = rt.chunk
        note = ""
        if rt.truth < self.truth:
            self.stale = True
            note += f" while truth epoch {self.truth} is current: STALE"
        first = self.released.setdefault(k, rt.truth)
        if first != rt.truth:
            self.dual = True
            note += f"; chunk {k} was already released under truth epoch {first}: DUAL OWNER"
        self.log(f"{w} releases chunk {k} (truth epoch {rt.truth}){note}")
        rt.chunk = k + 1

    def step(self, w: str) -> None:
        rt = self.rt[w]
        if rt is not None and rt.chunk < self.inputs and self.gate(w, rt):
            self.release(w, rt)

    def run(self) -> tuple[bool, bool]:
        ev = self.s["events"]
        for t in range(self.s["ticks"] + 6):
            self.t = t
            if self.repl is not None:
                self.repl.tick(t)
            while self.msgs and self.msgs[0][0] <= t:
                _, _, dest, msg = heapq.heappop(self.msgs)
                if self.state[dest] == "paused":
                    self.inbox[dest].append(msg)
                elif self.state[dest] == "up":
                    self.handle(dest, msg)
            for e in ev.get(t, ()):
                self.event(e)
            for e in self.pending.pop(t, ()):
                self.write(*e)
            for w in WORKERS:
                if self.state[w] == "up":
                    self.step(w)
        return self.dual, self.stale

    def event(self, e: tuple[Any, ...]) -> None:
        kind = e[0]
        if kind == "input":
            self.inputs += 1
            self.log(f"input {self.inputs - 1} arrives")
        elif kind == "pause" and self.state[e[1]] == "up":
            self.state[e[1]] = "paused"
            self.log(f"{e[1]} pauses mid-chunk")
        elif kind == "resume" and self.state[e[1]] == "paused":
            w = e[1]
            self.state[w] = "up"
            self.log(f"{w} resumes and finishes its in-flight chunk before reading messages")
            self.step(w)
            box, self.inbox[w] = self.inbox[w], []
            for msg in box:
                if self.state[w] == "up":
                    self.handle(w, msg)
        elif kind == "crash" and self.state[e[1]] != "down":
            self.state[e[1]], self.rt[e[1]], self.inbox[e[1]] = "down", None, []
            self.log(f"{e[1]} crashes")
        elif kind == "restart" and self.state[e[1]] == "down":
            self.state[e[1]] = "up"
            self.log(f"{e[1]} restarts empty")
        elif kind == "decide":
            _, replica, what, failed, target, lag = e
            token = self.read(what, failed, target)
            if token is not None:
                self.log(f"{replica} decides {what}{' of ' + failed if failed else ''} -> {target}"
                         f"{' (writes next tick)' if lag else ''}")
                self.pending.setdefault(self.t + lag, []).append((replica, what, token, target))

    def handle(self, w: str, msg: tuple[Any, ...]) -> None:
        if msg[0] == "assign":
            self.on_assign(w, msg[1], msg[2])
        else:
            self.on_revoke(w, msg[1], msg[2])

    # -- protocol hooks (each protocol implements all five) --
    @abstractmethod
    def read(self, what: str, failed: str | None, target: str) -> Any: ...

    @abstractmethod
    def write(self, replica: str, what: str, token: Any, target: str) -> None: ...

    @abstractmethod
    def on_assign(self, w: str, truth: int, epoch: int) -> None: ...

    @abstractmethod
    def on_revoke(self, w: str, truth: int, epoch: int) -> None: ...

    @abstractmethod
    def gate(self, w: str, rt: _Runtime) -> bool: ...


class _Placement(_Sim):
    """The three baselines: a plain placement record, written unconditionally."""

    claim_at_assign = False

    def __init__(self, schedule: dict[str, Any], trace: bool, store: Any) -> None:
        super().__init__(schedule, trace)
        self.store = store  # PlacementScripts, or the replicated store over one

    @property
    def placement(self) -> str | None:
        return self.store.call("session", [], [])[0]

    @property
    def progress(self) -> int:
        """The last released chunk, as recorded by releasers."""
        return self.store.call("session", [], [])[1]

    def read(self, what: str, failed: str | None, target: str) -> Any:
        p = self.placement
        if what == "open":
            return "" if p is None else None
        if what == "recover":
            return p if p == failed else None
        return p if p is not None and p != target else None

    def write(self, replica: str, what: str, token: Any, target: str) -> None:
        old = self.placement
        try:
            self.store.call("commit", [], [SID, target])
        except InfraError:
            self.log(f"{replica} placement write {target} not acknowledged")
            return
        if old == target:
            return
        self.truth += 1
        self.log(f"{replica} writes placement {target} (truth epoch {self.truth})")
        self.send(target, ("assign", self.truth, 0))
        if token:
            self.send(token, ("revoke", self.truth, 0))

    def on_assign(self, w: str, truth: int, epoch: int) -> None:
        rt = self.rt[w]
        if rt is not None:  # no epoch: a new assignment looks like a duplicate
            rt.truth = max(rt.truth, truth)
            return
        if self.claim_at_assign and self.placement != w:
            self.log(f"{w} claim refused (placement is {self.placement})")
            return
        self.rt[w] = _Runtime(truth, 0, self.progress + 1)
        self.log(f"{w} starts the session at chunk {self.progress + 1}")

    def on_revoke(self, w: str, truth: int, epoch: int) -> None:
        if self.rt[w] is not None:
            self.rt[w] = None
            self.log(f"{w} revoked: stops")

    def release(self, w: str, rt: _Runtime) -> None:
        super().release(w, rt)
        try:
            self.store.call("progress", [], [SID, rt.chunk - 1])
        except InfraError:
            pass  # released already; the record is only a hint for the next starter

    def gate(self, w: str, rt: _Runtime) -> bool:
        return True


class _Assignment(_Placement):
    name = "assignment"


class _ClaimOnly(_Placement):
    name = "claim-only"
    claim_at_assign = True


class _WorkerId(_Placement):
    name = "worker-id"

    def gate(self, w: str, rt: _Runtime) -> bool:
        if self.placement != w:
            self.log(f"{w} fenced: placement is {self.placement}")
            self.rt[w] = None
            return False
        return True


class _Generations(_Sim):
    """Ours, on the real store: commit CAS, claim, fenced chunk-index writes."""

    name = "generation"

    def __init__(self, schedule: dict[str, Any], trace: bool, store: Any) -> None:
        super().__init__(schedule, trace)
        self.store = store
        for w in WORKERS:
            store.register_worker(w, 2)

    def read(self, what: str, failed: str | None, target: str) -> Any:
        gen = self.store.current(SID)
        if what == "open":
            return 0 if gen is None else None
        if gen is None:
            return None
        if what == "recover":
            return gen if gen.worker_id == failed else None
        return gen if gen.worker_id != target else None

    def write(self, replica: str, what: str, token: Any, target: str) -> None:
        try:
            if what == "open":
                gen = self.store.commit(SID, 0, target)
            elif what == "recover":
                gen = self.store.commit(SID, token.epoch, target)
            else:
                gen = self.store.commit_migration(SID, token, target)
        except OwnershipError as exc:
            self.log(f"{replica} commit refused: {exc.reason_code}")
            return
        except InfraError:
            self.log(f"{replica} commit of {target} unacknowledged: counted as failed")
            return
        self.truth += 1  # on a replicated store a failover can take the store's epoch back
        self.log(f"{replica} commits {target}@{gen.epoch}")
        self.send(target, ("assign", gen.epoch, gen.epoch))
        if token:
            self.send(token.worker_id, ("revoke", gen.epoch, token.epoch))

    def on_assign(self, w: str, truth: int, epoch: int) -> None:
        rt = self.rt[w]
        if rt is not None and rt.epoch >= epoch:
            return
        try:
            self.store.claim(SID, Generation(w, epoch))
        except OwnershipError as exc:
            self.log(f"{w} claim of epoch {epoch} refused: {exc.reason_code}")
            return
        except InfraError:
            self.log(f"{w} claim of epoch {epoch} unacknowledged: not started")
            return
        view = self.store.session(SID)
        if view is None:  # a failover took the session away after the claim answered
            self.log(f"{w} claimed {w}@{epoch} but the store no longer knows the session")
            return
        start = 0 if view.chunk_index is None else view.chunk_index + 1
        self.rt[w] = _Runtime(truth, epoch, start)
        self.log(f"{w} claims {w}@{epoch}, restores at chunk {start}")

    def on_revoke(self, w: str, truth: int, epoch: int) -> None:
        rt = self.rt[w]
        if rt is not None and rt.epoch <= epoch:
            self.rt[w] = None
            self.log(f"{w} revoked: releases {w}@{rt.epoch}")

    def gate(self, w: str, rt: _Runtime) -> bool:
        try:
            self.store.write_progress(SID, Generation(w, rt.epoch), chunk_index=rt.chunk, input_seq=rt.chunk)
            return True
        except OwnershipError as exc:
            self.log(f"{w} fenced at chunk {rt.chunk}: {exc.reason_code}")
            self.rt[w] = None
            return False
        except InfraError:
            self.log(f"{w} holds chunk {rt.chunk}: its write was not acknowledged (tries again)")
            return False


_BASELINES = {"assignment": _Assignment, "claim-only": _ClaimOnly, "worker-id": _WorkerId}


def simulate(protocol: str, schedule: dict[str, Any], store: Any = None, trace: bool = False,
             replica: tuple[dict[str, Any], bool] | None = None) -> _Sim:
    """Run one protocol through one schedule; the result has ``dual``, ``stale``, ``trace``
    (and ``repl``, the replicated store, when ``replica`` = (plan, acknowledged) is given)."""
    repl = None
    if protocol == "generation":
        if replica is not None:
            repl = ReplicatedScripts(MemoryScripts(), *replica)
            store = SyncGenerationStore(None, "mem", backend=repl)
        sim: _Sim = _Generations(schedule, trace, store if store is not None else SyncMemoryGenerationStore())
    else:
        scripts = PlacementScripts()
        repl = ReplicatedScripts(scripts, *replica) if replica is not None else None
        sim = _BASELINES[protocol](schedule, trace, repl or scripts)
    if repl is not None:
        sim.repl, repl.log = repl, sim.log
    sim.run()
    return sim


def _rng(seed: int, i: int) -> random.Random:
    return random.Random(seed * 1_000_003 + i)


def _replica(seed: int, i: int, sched: dict[str, Any], ack: bool | None) -> tuple[dict[str, Any], bool] | None:
    """Schedule ``i``'s replica behaviour, drawn apart so the schedules match the plain study's."""
    if ack is None:
        return None
    return make_replica_plan(random.Random(f"replica-{seed}-{i}"), sched["ticks"]), ack


def _chunk(args: tuple[int, int, int, tuple[str, ...], bool | None]) -> dict[str, list[Any]]:
    """Schedules [lo, hi) through every protocol: counts, the shortest failing schedule and,
    on the replicated store, its failovers, lost writes and unacknowledged writes."""
    lo, hi, seed, protocols, ack = args
    out: dict[str, list[Any]] = {p: [0, 0, None, 0, 0, 0] for p in protocols}
    for i in range(lo, hi):
        sched = make_schedule(_rng(seed, i))
        replica = _replica(seed, i, sched, ack)
        for p in protocols:
            sim = simulate(p, sched, replica=replica)
            o = out[p]
            if sim.repl is not None:
                o[3] += sim.repl.failovers
                o[4] += sim.repl.lost
                o[5] += sim.repl.unacked
            if sim.dual or sim.stale:
                o[0] += sim.dual
                o[1] += sim.stale
                key = (sched["size"], sched["ticks"], i)
                if o[2] is None or key < o[2]:
                    o[2] = key
    return out


def _redis_sample(url: str, n: int, seed: int) -> tuple[int, int]:
    """``n`` schedules of the generation protocol on a real Redis; its keys are removed after."""
    import redis

    client = redis.Redis.from_url(url)
    dual = stale = 0
    prefix = f"ownership-check-{uuid.uuid4().hex[:8]}"
    base = SyncGenerationStore(client, prefix)
    try:
        for i in range(n):
            store = base.for_namespace(f"{prefix}-{i}")
            sim = simulate("generation", make_schedule(_rng(seed, 10_000_000 + i)), store)
            dual += sim.dual
            stale += sim.stale
            k = store.keys
            client.delete(k.session(SID), k.snapdata(SID), k.workers, *[k.slots(w) for w in WORKERS])
    finally:
        client.close()
    return dual, stale


def _protocol_report(p: str, parts: list[dict[str, list[Any]]], per: int, seed: int,
                     ack: bool | None) -> dict[str, Any]:
    dual = sum(part[p][0] for part in parts)
    stale = sum(part[p][1] for part in parts)
    best = min((part[p][2] for part in parts if part[p][2] is not None), default=None)
    example = None
    if best is not None:
        sched = make_schedule(_rng(seed, best[2]))
        sim = simulate(p, sched, trace=True, replica=_replica(seed, best[2], sched, ack))
        example = "\n".join(sim.trace or [])
    out = {"runs": per, "dual_owner_runs": dual, "stale_release_runs": stale, "example": example}
    if ack is not None:
        out.update(failovers=sum(part[p][3] for part in parts), lost_writes=sum(part[p][4] for part in parts),
                   unacknowledged_writes=sum(part[p][5] for part in parts))
    return out


def run(runs: int, protocols: list[str] | None = None, seed: int = 0, *, redis_url: str | None = None,
        redis_sample: int = 200, processes: int = 2, store: str = "linearizable",
        replica_ack: bool = True) -> dict[str, Any]:
    """Drive ``runs // len(protocols)`` schedules through each protocol; report violations.
    ``store="replica"``: on a master with an asynchronous replica that fails over
    (``infra.ownership_replica``), fenced writes acknowledged by the replica when
    ``replica_ack``; that model is pure, so no run goes to Redis."""
    protocols = list(protocols or PROTOCOLS)
    unknown = set(protocols) - set(PROTOCOLS)
    if unknown or store not in STORES:
        raise ValueError(f"unknown protocols {sorted(unknown)} or store {store!r}; known: {PROTOCOLS}, {STORES}")
    start = time.perf_counter()
    ack = replica_ack if store == "replica" else None
    per = runs // len(protocols)
    n_chunks = max(1, min(processes * 8, per // 500 or 1))
    bounds = [(per * j // n_chunks, per * (j + 1) // n_chunks, seed, tuple(protocols), ack) for j in range(n_chunks)]
    if processes > 1 and per >= 2000:
        with ProcessPoolExecutor(processes) as pool:
            parts = list(pool.map(_chunk, bounds))
    else:
        parts = [_chunk(b) for b in bounds]
    report = {p: _protocol_report(p, parts, per, seed, ack) for p in protocols}
    if redis_url and "generation" in protocols and redis_sample > 0 and ack is None:
        dual, stale = _redis_sample(redis_url, redis_sample, seed)
        g = report["generation"]
        g["redis_runs"] = redis_sample
        g["runs"] += redis_sample
        g["dual_owner_runs"] += dual
        g["stale_release_runs"] += stale
    total = sum(r["runs"] for r in report.values())
    model = {"model": store} if ack is None else {"model": store, "replica_ack": ack}
    return {"runs": total, "store": model, "protocols": report, "wall_s": round(time.perf_counter() - start, 3)}


if __name__ == "__main__":  # python -m infra.ownership_check RUNS [SEED] [REDIS_URL]
    import json
    import sys

    argv = sys.argv[1:]
    result = run(int(argv[0]) if argv else 4000, seed=int(argv[1]) if len(argv) > 1 else 0,
                 redis_url=argv[2] if len(argv) > 2 else None)
    print(json.dumps(result, indent=2))
