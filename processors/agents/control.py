"""The control agent: rebalancer and autoscaler, one active instance (the faust leader).

Every instance folds ``session-events``, ``worker-events`` and ``scaling-commands`` from
the start of the log into a :class:`~processors.cluster.ClusterView` (a group-less reader,
so each instance sees every partition); only the leader runs decision rounds, so a leader
change loses nothing. A round runs the configured policy on the view's snapshot and turns
its commands into records (:func:`command_records`): ``Migrate`` becomes a ``Handoff``,
scale commands go to ``scaling-commands``, and so does the admission plan (``Admit``,
``Place``, ``Restore``) that dispatch admits sessions by, through the Redis commit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

from processors import decisions as d
from processors.agents.detector import step_remembering
from processors.autoscaler import DEFAULT_VOLATILITY_TABLE, AutoscalerConfig, Slo, utilization
from processors.cluster import (BOOTING_PREFIX, ClusterView, apply, current_generation,
                                dead_workers, prune, to_snapshot)
from processors.detector import DetectorConfig, DetectorState, Signal, not_ahead, observe
from processors.latency import GpuProfile, LatencyModel, load_profiles
from processors.lifecycle import SessionEvent, session_event
from processors.placement import ADMIT_LIMIT, worst_latency
from processors.policy import BUILTIN_POLICIES, Policy, load_policy
from processors.policy_state import decode as decode_state
from processors.policy_state import encode as encode_state
from processors.snapshot import ChunkStats, GpuState, Snapshot
from processors.turboserve import TurboServeState
from schemas import records as r
from schemas.errors import ConfigError
from schemas.topics import SCALING_COMMANDS, SESSION_EVENTS, WORKER_EVENTS, misfiled
from streams.config_file import env_number

__all__ = ["ControlConfig", "ControlShell", "command_records", "admission_plan", "fit_capacity", "make_policy",
           "build_app"]

log = logging.getLogger(__name__)



# an admission plan carries at most this many order entries and pinned sessions (the
# sessions of one round; past them a session waits for the next plan, or goes least-loaded)
ADMIT_ORDER_MAX = ADMIT_LIMIT
ADMIT_PINS_MAX = 256
ADMIT_PINS_BYTES = 32 * 1024


def command_records(commands: Iterable[d.Command], view: ClusterView, now: float, *,
                    pool: str = "default", decision_id: str = "",
                    shutdown_resend_s: float = 10.0) -> tuple[r.Record, ...]:
    """The records that carry out a policy's commands (pure).

    ``Migrate`` -> ``Handoff`` stamped with the view's current generation of the session
    (dropped when the view has none on the source, or the target is a booting placeholder);
    ``Boot`` -> a ``ScaleOut`` of ``pool`` (one per GPU type, the Boots' counts summed); ``Vacate`` / ``Retire`` -> ``Drain`` / ``Shutdown``
    for the worker's pool (a ``Shutdown`` sent less than ``shutdown_resend_s`` ago is not
    repeated, and none goes to a worker no provisioner announced: it was started outside
    chunkserve). ``Admit``, ``Place`` and ``Restore`` go to dispatch as one plan
    (:func:`admission_plan`); Offload and Discard follow the user's events, which dispatch
    carries out: dropped.
    """
    out: list[r.Record] = []
    pools = {w.id: w.pool for w in view.workers.values()}
    boots: dict[str, int] = {}  # GPU type -> where its ScaleOut sits in ``out``
    for cmd in commands:
        match cmd:
            case d.Migrate(session_id=sid, src=src, dst=dst) if not dst.startswith(BOOTING_PREFIX):
                gen = current_generation(view, sid)
                if gen is not None and gen.worker_id == src:
                    out.append(r.Handoff(worker_id=src, session_id=sid, generation=gen, target_worker=dst,
                                         ts=now, reason=cmd.reason))
            case d.Boot(count=count, gpu_type=gpu_type) if gpu_type in boots:
                # one ScaleOut per decision and GPU type (a provisioner carries out a decision
                # id once: the floor's Boot beside the autoscaler's was refused as a replay)
                at = boots[gpu_type]  # the sum at most what a provisioner takes (past it, it took none)
                out[at] = replace(out[at], count=min(out[at].count + count, r.SCALE_OUT_MAX))  # type: ignore[union-attr]
            case d.Boot(count=count, gpu_type=gpu_type):
                boots[gpu_type] = len(out)
                out.append(r.ScaleOut(pool=pool, count=min(count, r.SCALE_OUT_MAX), ts=now, gpu_type=gpu_type,
                                      decision_id=decision_id))
            case d.Vacate(gpu_id=gid) if not gid.startswith(BOOTING_PREFIX):
                out.append(r.Drain(pool=pools.get(gid, pool), worker_id=gid, ts=now, decision_id=decision_id))
            case d.Retire(gpu_id=gid) if not gid.startswith(BOOTING_PREFIX):
                w = view.workers.get(gid)
                if w is not None and w.provisioned and now - w.shutdown_ts >= shutdown_resend_s:
                    out.append(r.Shutdown(pool=pools.get(gid, pool), worker_id=gid, ts=now, decision_id=decision_id))
                # else: unknown or started outside chunkserve: no provisioner here can stop it
    return tuple(out)


def admission_plan(commands: Iterable[d.Command], now: float, *, pool: str = "default",
                   policy: str = "", decision_id: str = "") -> r.AdmissionPlan:
    """The plan dispatch admits sessions by until the next round (pure): the policy's
    ``Admit`` order, and the sessions it placed itself (``Place``, ``Restore``) pinned to their
    GPU. A policy that issues no Admit gets a plan without fallback: its sessions wait for
    its pins, as in the simulator. Booting placeholders are left out (no worker to commit on)."""
    order: tuple[tuple[str, int], ...] = ()
    fallback = False
    pinned: dict[str, str] = {}
    for cmd in commands:
        match cmd:
            case d.Admit():
                order, fallback = cmd.order, cmd.fallback
            case d.Place(session_id=sid, gpu_id=gid) | d.Restore(session_id=sid, gpu_id=gid) if (
                    not gid.startswith(BOOTING_PREFIX)):
                pinned[sid] = gid
    slots = tuple(r.AdmitSlot(worker_id=g, count=n) for g, n in order
                  if not g.startswith(BOOTING_PREFIX))[:ADMIT_ORDER_MAX]
    return r.AdmissionPlan(pool=pool, ts=now, policy=policy, order=slots, fallback=fallback,
                           pinned=_bounded(pinned), decision_id=decision_id)


def _bounded(pinned: dict[str, str]) -> dict[str, str]:
    """The first pins, at most ADMIT_PINS_MAX and about ADMIT_PINS_BYTES of ids (the topic's
    record limit is 64 KiB); the rest wait for the next plan."""
    out: dict[str, str] = {}
    size = 0
    for sid, gpu in pinned.items():
        size += len(sid) + len(gpu) + 4
        if len(out) >= ADMIT_PINS_MAX or size > ADMIT_PINS_BYTES:
            break
        out[sid] = gpu
    return out


def fit_capacity(model: LatencyModel, view: ClusterView) -> LatencyModel:
    """The model with each GPU type's K set to what its live workers report, when they agree.

    The admission limit is the workers' (Redis counts their slots), so the policy must plan
    with the same K; the latency curve and price stay the profile's.
    """
    caps: dict[str, set[int]] = {}
    for w in view.workers.values():
        if w.alive and w.capacity > 0:
            caps.setdefault(w.gpu_type, set()).add(w.capacity)
    profiles = dict(model.profiles)
    for gpu_type, ks in caps.items():
        p = profiles.get(gpu_type)
        if p is not None and len(ks) == 1 and p.capacity != next(iter(ks)):
            profiles[gpu_type] = GpuProfile(p.name, next(iter(ks)), p.cost_per_hour, p.points, p.memory_bytes)
    return model if profiles == dict(model.profiles) else LatencyModel(profiles, model.name)


def make_policy(spec: str, model: LatencyModel, gpu_type: str, **autoscaler: Any) -> Policy:
    """The policy ``spec`` on ``model``; built-in TurboServe variants scale out ``gpu_type``."""
    if spec not in BUILTIN_POLICIES:
        return load_policy(spec)
    opts: dict[str, Any] = {"model": model}
    if spec.startswith("turboserve"):
        opts["autoscaler"] = AutoscalerConfig(gpu_type=gpu_type, **autoscaler)
    return load_policy(spec, **opts)


@dataclass(frozen=True)
class ControlConfig:
    """Policy and pacing; ``from_env`` reads ``CHUNKSERVE_POLICY``, ``CHUNKSERVE_PROFILE`` etc."""

    policy: str = "turboserve"
    profile: str = "reference-cpu"
    gpu_type: str = "cpu"
    pool: str = "default"
    tick_s: float = 0.5  # how often the leader looks for a pending round
    period_s: float = 5.0  # a round at least this often, even without events
    heartbeat_timeout_s: float = 10.0  # then a worker is declared down
    boot_s: float = 10.0  # expected worker boot time (the autoscaler's; also its scale-in delay)
    boot_timeout_s: float = 120.0  # a scale-out not answered by WorkerUp by then is forgotten
    dwell_s: float = 30.0
    min_gpus: int = 1
    max_gpus: int = 64
    burst_memory_s: float = 900.0  # how long the autoscaler's burst reserve remembers a rise
    # an SLO the autoscaler meets on the measured chunks (either set: on, the other Slo's default)
    slo_miss_rate: float | None = None
    slo_worst_s: float | None = None

    @property
    def slo(self) -> Slo | None:
        if self.slo_miss_rate is None and self.slo_worst_s is None:
            return None
        base = Slo()
        return Slo(base.miss_rate if self.slo_miss_rate is None else self.slo_miss_rate,
                   base.worst_s if self.slo_worst_s is None else self.slo_worst_s)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "ControlConfig":
        env = os.environ if env is None else env
        base = cls()
        names = {"tick_s": "CHUNKSERVE_CONTROL_TICK_S", "period_s": "CHUNKSERVE_CONTROL_PERIOD_S",
                 "heartbeat_timeout_s": "CHUNKSERVE_HEARTBEAT_TIMEOUT_S", "boot_s": "CHUNKSERVE_BOOT_S",
                 "boot_timeout_s": "CHUNKSERVE_BOOT_TIMEOUT_S", "dwell_s": "CHUNKSERVE_SCALE_DWELL_S",
                 "min_gpus": "CHUNKSERVE_MIN_WORKERS", "max_gpus": "CHUNKSERVE_MAX_WORKERS",
                 "burst_memory_s": "CHUNKSERVE_BURST_MEMORY_S", "policy": "CHUNKSERVE_POLICY",
                 "profile": "CHUNKSERVE_PROFILE", "gpu_type": "CHUNKSERVE_GPU_TYPE",
                 "pool": "CHUNKSERVE_POOL", "slo_miss_rate": "CHUNKSERVE_SLO_MISS_RATE",
                 "slo_worst_s": "CHUNKSERVE_SLO_WORST_S"}  # spelt out: the README's table is checked against the code
        kw: dict[str, Any] = {k: env[v] if isinstance(getattr(base, k), str)
                              else env_number(env, v, getattr(base, k), positive=k in _POSITIVE)
                              for k, v in names.items() if env.get(v)}
        cfg = replace(base, **kw)
        if cfg.heartbeat_timeout_s < MIN_HEARTBEAT_TIMEOUT_S:
            raise ConfigError("CHUNKSERVE_HEARTBEAT_TIMEOUT_S", f"must be at least {MIN_HEARTBEAT_TIMEOUT_S:g} s "
                              "(a worker beats every second: a shorter wait declares live workers down), got "
                              f"{env['CHUNKSERVE_HEARTBEAT_TIMEOUT_S'][:40]!r}", "environment")
        if cfg.slo_miss_rate is not None and cfg.slo_miss_rate >= 1:
            raise ConfigError("CHUNKSERVE_SLO_MISS_RATE", f"must be below 1 (a share of chunks), got "
                              f"{env['CHUNKSERVE_SLO_MISS_RATE'][:40]!r}", "environment")
        if cfg.max_gpus < max(1, cfg.min_gpus):
            raise ConfigError("CHUNKSERVE_MAX_WORKERS", f"must be at least 1 and CHUNKSERVE_MIN_WORKERS "
                              f"({cfg.min_gpus}), got {cfg.max_gpus}", "environment")
        if env.get("CHUNKSERVE_POLICY") and cfg.policy not in BUILTIN_POLICIES and ":" not in cfg.policy:
            raise ConfigError("policy", f"unknown policy {cfg.policy[:80]!r} (built-ins: {', '.join(BUILTIN_POLICIES)}; "
                              "or module:Name)", "env CHUNKSERVE_POLICY")
        if env.get("CHUNKSERVE_PROFILE") or env.get("CHUNKSERVE_GPU_TYPE"):  # named as the variables they came from
            try:
                model = load_profiles(cfg.profile)
            except ConfigError as exc:
                raise profile_error(exc, cfg.profile) from None
            if cfg.gpu_type not in model:
                raise ConfigError("gpu_type", f"no latency profile for {cfg.gpu_type[:80]!r} in profile "
                                  f"{cfg.profile[:80]!r} (it has {', '.join(sorted(model.profiles))})",
                                  "env CHUNKSERVE_GPU_TYPE" if env.get("CHUNKSERVE_GPU_TYPE") else "env CHUNKSERVE_PROFILE")
        return cfg


def profile_error(exc: ConfigError, spec: str) -> ConfigError:
    """``load_profiles``'s error for ``spec``, named as ``CHUNKSERVE_PROFILE`` (where it came from)."""
    reason = str(exc).split("profile: ", 1)[-1]
    if spec not in reason:
        reason = f"{spec[:200]}: {reason}"
    return ConfigError("profile", reason, "env CHUNKSERVE_PROFILE")


MAX_FRESH_EVENTS = 100_000  # session events kept for the next round's snapshot


def measured(stats: ChunkStats, latency_s: float, deadline_s: float) -> ChunkStats:
    """``stats`` with one more chunk of ``latency_s``, past its deadline when the worker said
    its chunks' media duration (``deadline_s`` > 0) and the chunk took longer."""
    return ChunkStats(stats.count + 1, stats.missed + int(0 < deadline_s < latency_s),
                      max(stats.worst_s, latency_s))


MIN_HEARTBEAT_TIMEOUT_S = 2.0  # two of a worker's heartbeats (one a second)
_POSITIVE = {"tick_s", "period_s", "heartbeat_timeout_s", "boot_timeout_s", "max_gpus", "slo_worst_s"}  # 0 would never act


@dataclass
class ControlShell:
    """The view, the detector window and the policy state; ``round`` is one decision."""

    config: ControlConfig = field(default_factory=ControlConfig)
    clock: Callable[[], float] = time.time
    view: ClusterView = field(default_factory=ClusterView)
    detector: DetectorState = field(default_factory=DetectorState)
    detector_config: DetectorConfig = field(default_factory=DetectorConfig)
    dirty: bool = True
    last_round: float = -math.inf
    last_report: Any = None
    log_up: bool = True  # whether the broker answered the last probe
    log_up_since: float = -math.inf  # when it answered again after an outage

    def __post_init__(self) -> None:
        self.model = load_profiles(self.config.profile)
        self.model[self.config.gpu_type]  # an unknown GPU type or policy is refused at start (ConfigError)
        self.policy(self.model)
        self.policy_state: Any = None
        self.state_at = -math.inf  # the time of the round that left policy_state
        self.logged: r.PolicyState | None = None  # the latest state a leader put in the log
        self.published: bytes | None = None
        self.plan_sent: Any = None  # what the last admission plan published said
        self.fresh: list[SessionEvent] = []  # session events folded since the last round (snapshot.events)
        self.chunks = ChunkStats()  # chunks reported since the last round (snapshot.chunks)
        self.deadlines: dict[str, float] = {}  # per worker, its chunks' media duration (WorkerUp)
        self.closed: dict[str, None] = {}  # ids closed (bounded): their events move the window no more

    def policy(self, model: LatencyModel) -> Policy:
        cfg = self.config
        return make_policy(cfg.policy, model, cfg.gpu_type, min_gpus=cfg.min_gpus, max_gpus=cfg.max_gpus,
                           dwell_s=cfg.dwell_s, boot_s=cfg.boot_s, burst_memory_s=cfg.burst_memory_s,
                           slo=cfg.slo)

    def fold(self, rec: r.Record) -> None:
        """Fold one record; an arrival, departure or flip (or a worker change) asks for a round."""
        if isinstance(rec, r.PolicyState):  # another leader's (or an earlier) round left it
            if rec.policy == self.config.policy and rec.ts > self.state_at:
                self.logged = rec  # that round saw the events and chunks before it
                self.fresh, self.chunks = [], ChunkStats()
            return
        if isinstance(rec, r.ChunkDone):
            self.chunks = measured(self.chunks, rec.latency_s, self.deadlines.get(rec.worker_id, 0.0))
            return
        if isinstance(rec, r.WorkerUp):
            self.deadlines[rec.worker_id] = rec.chunk_interval_s
            if rec.gpu_type not in self.model:
                log.warning("control: worker %s reports GPU type %r, which profile %s has no latency curve "
                            "for (types: %s): it is left out of placement and scaling", rec.worker_id[:80],
                            rec.gpu_type[:80], self.config.profile, ", ".join(sorted(self.model)))
        elif isinstance(rec, r.WorkerDown):  # gone (the map stays bounded): a late chunk of it counts no miss
            self.deadlines.pop(rec.worker_id, None)
        event = session_event(rec)
        if event is not None:
            before = self.view.sessions.get(event.session_id)
            self.detector, _ = step_remembering(self.detector, not_ahead(event, self.clock()),
                                                self.detector_config, self.closed)
            self.fresh.append(event)
            if len(self.fresh) > MAX_FRESH_EVENTS:  # no round for a long while: the newest
                del self.fresh[:len(self.fresh) - MAX_FRESH_EVENTS]
        self.view = apply(self.view, rec)
        if event is not None:
            after = self.view.sessions.get(rec.session_id)  # type: ignore[attr-defined]
            self.dirty |= before is None or after is None or before.lifecycle != after.lifecycle
        elif isinstance(rec, (r.WorkerUp, r.WorkerDown)):
            self.dirty = True

    def log_state(self, up: bool, now: float) -> None:
        """Record whether the broker answered at ``now`` (the fold loop probes it)."""
        if up != self.log_up:
            log.warning("control: the broker %s", "answers again: decisions resume after two "
                        "heartbeat timeouts" if up else "does not answer: decisions wait")
        if up and not self.log_up:
            self.log_up_since = now
        self.log_up = up

    def due(self, now: float) -> bool:
        """A round is due on a change or once a period, but never while the broker is away
        nor within two heartbeat timeouts of its return: no worker could be heard meanwhile
        (and each client reconnects at its own pace), so missed heartbeats would read as
        deaths."""
        if not self.log_up or now - self.log_up_since <= 2 * self.config.heartbeat_timeout_s:
            return False
        return self.dirty or now - self.last_round >= self.config.period_s

    def decide(self, now: float | None = None) -> list[r.Record]:
        """One decision round: the records to publish (already folded into the view)."""
        now = self.clock() if now is None else now
        cfg = self.config
        self.dirty, self.last_round = False, now
        out: list[r.Record] = [r.WorkerDown(worker_id=w, ts=now, reason="missed heartbeats")
                               for w in dead_workers(self.view, now, cfg.heartbeat_timeout_s)]
        for rec in out:
            self.view = apply(self.view, rec)
        model = fit_capacity(self.model, self.view)
        policy = self.policy(model)
        snap = replace(to_snapshot(self.view, now, heartbeat_timeout_s=cfg.heartbeat_timeout_s,
                                   boot_timeout_s=cfg.boot_timeout_s, gpu_types=set(model)),
                       events=tuple(self.fresh), chunks=self.chunks)
        self.fresh, self.chunks = [], ChunkStats()
        self.detector, signal = observe(self.detector, now, self.detector_config)
        state = self._policy_state(policy)
        decision = policy.decide(snap, signal, state)
        self.policy_state, self.state_at = decision.state, now
        decision_id = uuid.uuid4().hex[:12]
        recs = command_records(decision.commands, self.view, now, pool=cfg.pool, decision_id=decision_id)
        recs += self._new_plan(admission_plan(decision.commands, now, pool=cfg.pool, policy=cfg.policy,
                                              decision_id=decision_id))
        for rec in recs:
            self.view = apply(self.view, rec)
        out += recs
        out += self._reports(snap, model, signal, recs, now, policy)
        blob = encode_state(decision.state)
        if blob is not None and blob != self.published:  # the state survives a leader change
            self.published = blob
            out.append(r.PolicyState(pool=cfg.pool, ts=now, policy=cfg.policy, state=blob,
                                     decision_id=decision_id))
        self.view = prune(self.view, now - 3600.0)
        return out

    def _new_plan(self, plan: r.AdmissionPlan) -> tuple[r.Record, ...]:
        """The plan, unless it says what the last one published said."""
        key = (plan.order, plan.pinned, plan.fallback)
        if key == self.plan_sent:
            return ()
        self.plan_sent = key
        return (plan,)

    def _policy_state(self, policy: Policy) -> Any:
        if self.logged is not None and self.logged.ts > self.state_at:  # a later leader's state
            logged = decode_state(policy.initial_state(), self.logged.state)
            if logged is not None:
                self.policy_state, self.state_at = logged, self.logged.ts
        self.logged = None
        state = self.policy_state if self.policy_state is not None else policy.initial_state()
        if isinstance(state, TurboServeState) and math.isfinite(self.view.last_scale_ts):
            last = state.autoscaler.last_action_at
            # the dwell survives a leader change: the last scale action is in the log
            at = max(last if last is not None else -math.inf, self.view.last_scale_ts)
            state = replace(state, autoscaler=replace(state.autoscaler, last_action_at=at))
        return state

    def _reports(self, snap: Snapshot, model: LatencyModel, signal: Signal, recs: tuple[r.Record, ...],
                 now: float, policy: Any) -> list[r.Record]:
        out: list[r.Record] = []
        handoffs = [x for x in recs if isinstance(x, r.Handoff)]
        after = to_snapshot(self.view, now, heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                            boot_timeout_s=self.config.boot_timeout_s, gpu_types=set(model))
        loads = {k: v for k, v in sorted(after.loads().items()) if not k.startswith(BOOTING_PREFIX)}
        key = (len(after.gpus), loads)
        if handoffs or key != self.last_report:
            self.last_report = key
            out.append(r.PlacementReport(ts=now, workers=len(loads), sessions=sum(loads.values()),
                                         worst_latency_s=worst_latency(after, model), migrations=len(handoffs),
                                         source="control", loads=dict(list(loads.items())[:256])))
        outs = [x for x in recs if isinstance(x, r.ScaleOut)]
        drains = [x for x in recs if isinstance(x, r.Drain)]
        if outs or drains:
            u_max, _ = utilization(snap, model)
            table = getattr(policy, "table", DEFAULT_VOLATILITY_TABLE)
            u_target, delta = table.lookup(signal.level)
            current = sum(1 for g in snap.gpus if g.state is not GpuState.DRAINING)
            target = current + sum(x.count for x in outs) - len(drains)
            out.append(r.ScalingDecision(ts=now, current=current, target=max(0, target),
                                         u_max=min(u_max, 1e6), u_target=u_target, delta=delta,
                                         level=signal.level, reason="scale-out" if outs else "scale-in"))
        return out


_FOLDED = (SESSION_EVENTS, WORKER_EVENTS, SCALING_COMMANDS)  # the topics control folds


async def _fold_log(settings: Any, catalogue: Any, shell: "ControlShell", caught_up: dict[str, bool]) -> None:
    """Fold the whole log from its start, then what follows; ``caught_up`` once at the end
    it had when the fold began."""
    from streams.kafka import RecordConsumer, RecordProducer

    producer = await RecordProducer(settings, catalogue, client_id="control-fold").start()
    consumer = RecordConsumer(settings, list(_FOLDED), producer, name="control", catalogue=catalogue)

    async def skip(topic: str, partition: int, offset: int, *_: Any) -> None:
        # a group-less reader: the topic's own consumers dead-letter bad records, once
        log.warning("control: skipping undecodable %s[%d]@%d", topic, partition, offset)

    consumer.dead_letter = skip  # type: ignore[method-assign]
    await consumer.start(subscribe=False)
    try:
        ends = await consumer.assign(dict.fromkeys(_FOLDED))
        while True:
            for delivered in await consumer.poll(timeout_ms=200):
                if misfiled(delivered.record, delivered.key) is None:  # dispatch refuses a misfiled one
                    shell.fold(delivered.record)
            if not caught_up["done"]:
                caught_up["done"] = await consumer.reached(ends)
    finally:
        await consumer.stop()
        await producer.stop()


async def _probe_log(settings: Any, catalogue: Any, shell: "ControlShell", tick_s: float) -> None:
    """Ask the broker for the folded partitions' end offsets every tick: whether it answers."""
    from aiokafka import TopicPartition

    from streams.kafka import RecordConsumer

    probe = RecordConsumer(settings, list(_FOLDED), None, name="control-probe", catalogue=catalogue,
                           request_timeout_ms=5000)
    await probe.start(subscribe=False)
    try:
        tps = [TopicPartition(catalogue.name(t), p) for t in _FOLDED for p in await probe.partitions(t)]
        while True:
            try:
                await asyncio.wait_for(probe.raw.end_offsets(tps), max(1.0, 2 * tick_s))
                shell.log_state(True, shell.clock())
            except Exception:  # unreachable, no leader, timed out: the broker is away
                shell.log_state(False, shell.clock())
            await asyncio.sleep(tick_s)
    finally:
        await probe.stop()


def build_app(settings: Any) -> Any:
    """The faust app: every instance folds the log; the leader runs the rounds."""
    from streams.faust_app import FaustPublisher, make_app
    from streams.topics import TopicCatalogue

    app = make_app("control", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    config = ControlConfig.from_env()
    shell = ControlShell(config)
    caught_up = {"done": False}

    @app.task
    async def fold_log() -> None:
        await _fold_log(settings, catalogue, shell, caught_up)

    @app.task
    async def probe_log() -> None:
        await _probe_log(settings, catalogue, shell, config.tick_s)

    @app.timer(config.tick_s, on_leader=True)
    async def decide() -> None:
        if not caught_up["done"] or not shell.due(shell.clock()):
            return
        for rec in shell.decide():
            await publisher.send(rec)

    return app
