"""The control agent: rebalancer and autoscaler, one active instance (the faust leader).

Every instance folds ``session-events``, ``worker-events`` and ``scaling-commands`` from
the start of the log into a :class:`~processors.cluster.ClusterView` (a group-less reader,
so each instance sees every partition); only the leader runs decision rounds, so a leader
change loses nothing. A round runs the configured policy on the view's snapshot and turns
its commands into records (:func:`~processors.agents.control_records.command_records`): ``Migrate`` becomes a ``Handoff``,
scale commands go to ``scaling-commands``, and so does the admission plan (``Admit``,
``Place``, ``Restore``) that dispatch admits sessions by, through the Redis commit.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from processors.agents.control_config import ControlConfig, fit_capacity, make_policy, takes_model
from processors.agents.control_records import admission_plan, carried, command_records
from processors.agents.detector import step_remembering
from processors.autoscaler import utilization
from processors.cluster import BOOTING_PREFIX, ClusterView, apply, dead_workers, prune, to_snapshot
from processors.detector import DetectorConfig, DetectorState, Signal, not_ahead, observe
from processors.latency import LatencyModel, load_profiles
from processors.lifecycle import SessionEvent, session_event
from processors.placement import worst_latency
from processors.policy import Decision, Policy
from processors.policy_state import decode as decode_state
from processors.policy_state import encode as encode_state
from processors.snapshot import ChunkStats, GpuState, Snapshot
from processors.turboserve import TurboServeState
from schemas import records as r
from schemas.topics import SCALING_COMMANDS, SESSION_EVENTS, WORKER_EVENTS, misfiled

__all__ = ["ControlShell", "build_app"]

log = logging.getLogger(__name__)



MAX_FRESH_EVENTS = 100_000  # session events kept for the next round's snapshot
# closed sessions, down workers and scale-outs are forgotten this long after their last record
# (far behind the consumer's position: one redelivered after it would be folded again)
VIEW_KEEP_S = 3600.0


def measured(stats: ChunkStats, latency_s: float, deadline_s: float) -> ChunkStats:
    """``stats`` with one more chunk of ``latency_s``, past its deadline when the worker said
    its chunks' media duration (``deadline_s`` > 0) and the chunk took longer."""
    return ChunkStats(stats.count + 1, stats.missed + int(0 < deadline_s < latency_s), max(stats.worst_s, latency_s),
                      min((d for d in (stats.deadline_s, deadline_s) if d > 0), default=0.0))




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
        self.typed = takes_model(self.config.policy)
        self.policy_state: Any = None
        self.state_at = -math.inf  # the time of the round that left policy_state
        self.logged: r.PolicyState | None = None  # the latest state a leader put in the log
        self.published: bytes | None = None
        self.plan_sent: Any = None  # what the last admission plan published said
        self.fresh: list[SessionEvent] = []  # session events folded since the last round (snapshot.events)
        self.chunks = ChunkStats()  # chunks reported since the last round (snapshot.chunks)
        self.deadlines: dict[str, float] = {}  # per worker, its chunks' media duration (WorkerUp)
        self.closed: dict[str, None] = {}  # ids closed (bounded): their events move the window no more

    def _typed(self, model: LatencyModel) -> LatencyModel | None:
        """``model`` when the policy plans with it (workers typed by their slots), else None."""
        return model if self.typed else None

    def policy(self, model: LatencyModel) -> Policy:
        cfg = self.config
        return make_policy(cfg.policy, model, cfg.gpu_type, min_gpus=cfg.min_gpus, max_gpus=cfg.max_gpus,
                           dwell_s=cfg.dwell_s, boot_s=cfg.boot_s, burst_memory_s=cfg.burst_memory_s,
                           settle_s=cfg.settle_s, slo=cfg.slo)

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
                                   boot_timeout_s=cfg.boot_timeout_s, gpu_types=set(model), model=self._typed(model)),
                       events=tuple(self.fresh), chunks=self.chunks)
        self.fresh, self.chunks = [], ChunkStats()
        self.detector, signal = observe(self.detector, now, self.detector_config)
        state = self._policy_state(policy)
        try:
            decision = policy.decide(snap, signal, state)
            if not isinstance(decision, Decision):
                raise TypeError(f"it returned {type(decision).__name__}, not a Decision")
        except Exception as exc:  # noqa: BLE001 - a plug-in's code: said, and the deaths go out all the same
            log.error("control: policy %s failed its round at %.3f (%s: %s): no decision this round",
                      cfg.policy, now, type(exc).__name__, str(exc)[:300])
            return out
        self.policy_state, self.state_at = decision.state, now
        decision_id = uuid.uuid4().hex[:12]
        commands, refused = carried(decision.commands)
        if refused:  # a plug-in's: said, and the rest carried out (the simulator counts them as invalid)
            log.warning("control: policy %s returned %d command(s) no record can carry (a field of the wrong type, "
                        "a Boot of no whole count from 1): not carried out", cfg.policy, refused)
        recs = command_records(commands, self.view, now, pool=cfg.pool, decision_id=decision_id)
        recs += self._new_plan(admission_plan(commands, now, pool=cfg.pool, policy=cfg.policy, decision_id=decision_id))
        for rec in recs:
            self.view = apply(self.view, rec)
        out += recs
        out += self._reports(snap, model, signal, recs, now, policy.band(decision.state)
                             if callable(getattr(policy, "band", None)) else (0.0, 0.0))
        blob = encode_state(decision.state)
        if blob is not None and blob != self.published:  # the state survives a leader change
            self.published = blob
            out.append(r.PolicyState(pool=cfg.pool, ts=now, policy=cfg.policy, state=blob,
                                     decision_id=decision_id))
        self.view = prune(self.view, now - VIEW_KEEP_S)
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
            else:  # another version's or policy's: said, not used
                log.warning("control: the %s state a leader logged at %.3f does not decode as this version's: "
                            "this round starts from its own", self.config.policy, self.logged.ts)
        self.logged = None
        state = self.policy_state if self.policy_state is not None else policy.initial_state()
        if isinstance(state, TurboServeState) and math.isfinite(self.view.last_scale_ts):
            last = state.autoscaler.last_action_at
            # the dwell survives a leader change: the last scale action is in the log
            at = max(last if last is not None else -math.inf, self.view.last_scale_ts)
            state = replace(state, autoscaler=replace(state.autoscaler, last_action_at=at))
        return state

    def _reports(self, snap: Snapshot, model: LatencyModel, signal: Signal, recs: tuple[r.Record, ...],
                 now: float, band: tuple[float, float]) -> list[r.Record]:
        """A placement report when the pool's loads changed, and a scaling decision's figures
        (``band``: the u* and delta the policy held the pool to; 0 for one that has none)."""
        out: list[r.Record] = []
        handoffs = [x for x in recs if isinstance(x, r.Handoff)]
        after = to_snapshot(self.view, now, heartbeat_timeout_s=self.config.heartbeat_timeout_s,
                            boot_timeout_s=self.config.boot_timeout_s, gpu_types=set(model), model=self._typed(model))
        loads = {k: v for k, v in sorted(after.loads().items()) if not k.startswith(BOOTING_PREFIX)}
        key = (len(after.gpus), loads)
        if handoffs or key != self.last_report:
            self.last_report = key
            out.append(r.PlacementReport(ts=now, workers=len(loads), sessions=sum(loads.values()),
                                         worst_latency_s=worst_latency(after, model), migrations=len(handoffs),
                                         source="control", loads=dict(list(loads.items())[:256])))
        outs = [x for x in recs if isinstance(x, r.ScaleOut)]
        drains = [x for x in recs if isinstance(x, r.Drain)]
        back = [x for x in recs if isinstance(x, r.Reinstate)]
        if outs or drains or back:
            u_max, _ = utilization(snap, model)
            u_target, delta = band
            current = sum(1 for g in snap.gpus if g.state is not GpuState.DRAINING)
            target = current + sum(x.count for x in outs) + len(back) - len(drains)
            out.append(r.ScalingDecision(ts=now, current=current, target=max(0, target),
                                         u_max=min(u_max, 1e6), u_target=u_target, delta=delta,
                                         level=signal.level, reason="scale-out" if outs or back else "scale-in"))
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
                if delivered.refused is not None:  # the provisioner and dispatch refuse it too
                    log.warning("control: refused %s on %s[%d]@%d keyed %r (%s): not folded", delivered.record.TAG,
                                delivered.topic, delivered.partition, delivered.offset, delivered.key,
                                delivered.refused)
                elif misfiled(delivered.record, delivered.key) is None:  # dispatch refuses a misfiled one
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
            except Exception as exc:  # unreachable, no leader, timed out: the broker is away
                log.debug("control: the broker probe failed (%s: %s)", type(exc).__name__, exc)
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
