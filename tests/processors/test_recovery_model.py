"""Model-based test of dispatch and recovery: capacity shortage, idles and returns (offload and
restore), migrations (the source froze, dispatch commits the move), worker pause and resume,
worker death, restarts and a dispatch replica dying between its commit and its Assign,
interleaved.

Two dispatch replicas share the in-memory store twin; workers claim what they are assigned
while they are alive. Invariants after every step: no input is routed to a worker marked
down, no session closed by its user is active or moved again, slots never exceed capacity.
At the end, with every worker back and every user back, every open session has a live
owner that claimed it, no recovery is owed, and every input was applied or refused with a
reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from infra.chaos import refused_inputs
from processors.agents.dispatch import DispatchShell
from processors.recovery import CLAIM_GRACE_S
from schemas.records import (Assign, CommandRejected, DeadLetter, Frozen, Heartbeat, InputPushed, Record,
                             Resume, Revoke, RoutedInput, SessionActive, SessionClosed, SessionIdle,
                             SessionOpened, Suspend, Terminate, WorkerDown)
from streams.generations_memory import MemoryGenerationStore
from streams.input_log import LoggedInput

WORKERS = ("w1", "w2", "w3")
CAPACITY = 1
SESSIONS = ("s0", "s1", "s2", "s3")  # more than the fleet holds: a shortage is possible


class Bus:
    """What replicas publish; ``lose`` drops the next record a replica publishes (it died
    after its commit, before its send)."""

    def __init__(self, model: "RecoveryMachine") -> None:
        self.model = model
        self.lose = False

    async def send(self, rec: Record, wait: bool = False) -> None:
        if self.lose and isinstance(rec, Assign):
            self.lose = False
            return
        self.model.on_sent(rec)


class RecoveryMachine(RuleBasedStateMachine):
    @initialize()
    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = MemoryGenerationStore("m")
        self.now = 1000.0
        self.bus = Bus(self)
        self.replicas = [DispatchShell(self.store, self.bus, clock=lambda: self.now, view_ttl_s=0.0,
                                       admission_timeout_s=0.0, owner_wait_s=0.0, name=f"d{i}",
                                       read_inputs=self.read_inputs)
                         for i in range(2)]
        self.alive = {w: True for w in WORKERS}  # the process runs (not killed, not paused)
        self.opened: set[str] = set()
        self.closed: set[str] = set()
        self.pending: list[Assign | Terminate] = []  # commands not yet taken by their worker
        self.seq: dict[str, int] = {}
        self.pushed: set[tuple[str, int]] = set()
        self.refused: set[tuple[str, int]] = set()
        self.accepted: set[tuple[str, int]] = set()
        self.bad_routes: list[str] = []
        for w in WORKERS:
            self.run(self.store.register_worker(w, CAPACITY))

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.loop.close()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def read_inputs(self, sid: str, after_seq: int) -> list[LoggedInput]:
        # one partition, each input at its own offset (a dead letter is sent once per place)
        return [LoggedInput(0, SESSIONS.index(s) * 1000 + q,
                            InputPushed(session_id=s, seq=q, kind="text", payload="x", ts=0.0))
                for s, q in sorted(self.pushed) if s == sid and q > after_seq]

    def on_sent(self, rec: Record) -> None:
        if isinstance(rec, (Assign, Terminate, RoutedInput, Suspend, Resume, Revoke)):
            self.pending.append(rec)
        if isinstance(rec, RoutedInput):
            if self.run_view()[rec.worker_id].down:
                self.bad_routes.append(f"{rec.session_id}#{rec.seq} to down {rec.worker_id}")
        elif isinstance(rec, DeadLetter):
            self.refused |= refused_inputs([rec])

    def run_view(self) -> Any:
        return _sync_view(self.store)

    # --- the world ------------------------------------------------------------------

    @rule(sid=st.sampled_from(SESSIONS), r=st.integers(0, 1))
    def open(self, sid: str, r: int) -> None:
        if sid in self.opened:
            return
        self.opened.add(sid)
        self.run(self.replicas[r].on_session_event(SessionOpened(session_id=sid, ts=self.now, prompt="p")))

    @rule(sid=st.sampled_from(SESSIONS), r=st.integers(0, 1))
    def close(self, sid: str, r: int) -> None:
        if sid not in self.opened or sid in self.closed:
            return
        self.closed.add(sid)
        self.run(self.replicas[r].on_session_event(SessionClosed(session_id=sid, ts=self.now)))

    @precondition(lambda self: bool(self.opened - self.closed))
    @rule(data=st.data(), r=st.integers(0, 1))
    def push(self, data: st.DataObject, r: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.opened - self.closed)))
        self.seq[sid] = self.seq.get(sid, 0) + 1
        self.pushed.add((sid, self.seq[sid]))
        why = self.run(self.replicas[r].route_input(sid, self.seq[sid], "text", "x", ts=self.now))
        if why is not None:
            self.refused.add((sid, self.seq[sid]))

    @precondition(lambda self: bool(self.opened - self.closed))
    @rule(data=st.data(), r=st.integers(0, 1), active=st.booleans(), lost=st.booleans())
    def flip(self, data: st.DataObject, r: int, active: bool, lost: bool) -> None:
        """The user goes idle (offload) or comes back (restore), duplicates included.
        ``lost``: the replica dies after a restore's commit, before its Assign is published,
        and the other replica reads the return again."""
        sid = data.draw(st.sampled_from(sorted(self.opened - self.closed)))
        rec = SessionActive(session_id=sid, ts=self.now) if active else SessionIdle(session_id=sid, ts=self.now)
        self.bus.lose = lost and active
        self.run(self.replicas[r].on_session_event(rec))
        self.bus.lose = False
        if lost and active:
            self.run(self.replicas[1 - r].on_session_event(rec))

    @precondition(lambda self: bool(self.opened - self.closed))
    @rule(data=st.data(), r=st.integers(0, 1), lost=st.booleans())
    def migrate(self, data: st.DataObject, r: int, lost: bool) -> None:
        """Control asked for a handoff and the source froze at a chunk boundary: it reports
        Frozen, and dispatch commits the move (or resumes the source when the store refuses).
        ``lost``: the replica dies after the commit, before its Assign is published, so the
        Frozen (its offset not committed) is read again by the other replica."""
        sid = data.draw(st.sampled_from(sorted(self.opened - self.closed)))
        view = self.run(self.store.session(sid))
        if view is None or view.state != "active" or not view.claimed or not self.alive[view.generation.worker_id]:
            return
        target = data.draw(st.sampled_from([w for w in WORKERS if w != view.generation.worker_id]))
        frozen = Frozen(worker_id=view.generation.worker_id, session_id=sid, generation=view.generation,
                        target_worker=target, ts=self.now)
        self.bus.lose = lost
        self.run(self.replicas[r].on_worker_event(frozen))
        self.bus.lose = False
        if lost:
            self.run(self.replicas[1 - r].on_worker_event(frozen))

    @precondition(lambda self: any(self.alive.values()))
    @rule(data=st.data(), r=st.integers(0, 1))
    def worker_dies(self, data: st.DataObject, r: int) -> None:
        """Killed or paused past detection: control declares it down."""
        w = data.draw(st.sampled_from([w for w in WORKERS if self.alive[w]]))
        self.alive[w] = False
        self.now += 1
        self.run(self.replicas[r].on_worker_event(WorkerDown(worker_id=w, ts=self.now, reason="missed heartbeats")))

    @precondition(lambda self: not all(self.alive.values()))
    @rule(data=st.data(), r=st.integers(0, 1), restarted=st.booleans())
    def worker_returns(self, data: st.DataObject, r: int, restarted: bool) -> None:
        """Resumed (it heartbeats again) or restarted under the same id (it queues what its
        previous run held, then heartbeats)."""
        w = data.draw(st.sampled_from([w for w in WORKERS if not self.alive[w]]))
        self._returns(w, r, restarted)

    def _returns(self, w: str, r: int, restarted: bool) -> None:
        self.alive[w] = True
        self.now += 1
        if restarted:
            self.run(self.store.strand(w, self.now))
            self.run(self.store.set_up(w, self.now))
        self.run(self.replicas[r].on_worker_event(
            Heartbeat(worker_id=w, ts=self.now, sessions=0, executing=0, capacity=CAPACITY)))

    @rule()
    def workers_poll(self) -> None:
        self.deliver()

    @rule(r=st.integers(0, 1), lose=st.booleans(), dt=st.sampled_from([0.3, 2.0, CLAIM_GRACE_S + 1]))
    def sweep(self, r: int, lose: bool, dt: float) -> None:
        self.now += dt
        self.bus.lose = lose  # the replica dies after one commit, before its Assign
        self.run(self.replicas[r].sweep())
        self.bus.lose = False
        self.deliver()

    def deliver(self) -> None:
        """Live workers take their commands, as the real one does: an Assign of the current
        generation is claimed (a recovering one replays the session's inputs after the last one
        applied, from the log); an input is applied once its generation is claimed (kept until
        then) and refused back to dispatch when its generation is not the active one; a Suspend
        or Terminate of the current generation ends it in the store (offloaded, closed); a
        Resume that finds it offloaded is refused (dispatch restores it). A dead process loses
        them."""
        pending, self.pending = self.pending, []
        for c in pending:
            if not self.alive[c.worker_id]:
                continue
            view = self.run(self.store.session(c.session_id))
            mine = view is not None and view.generation == c.generation
            if isinstance(c, RoutedInput) and not (mine and view.state == "active"):
                self.refuse(c, "stale_epoch")  # the worker refuses what is not its own: routed again
                continue
            if isinstance(c, Resume) and mine and view.state == "suspended":
                self.refuse(c, "not_owner")  # the Resume came after the Suspend: restored elsewhere
                continue
            if isinstance(c, (Suspend, Terminate)) and mine and view.state != "closed":
                # held or not yet claimed (the command overtook the Assign): ended in the store
                self.run(self.store.release(c.session_id, c.generation, close=isinstance(c, Terminate)))
                continue
            if not mine or view.state != "active" or isinstance(c, (Resume, Revoke, Suspend, Terminate)):
                continue  # stale, or kept where it is / moved away (waiting inputs come back refused)
            if isinstance(c, Assign):
                self.run(self.store.claim(c.session_id, c.generation))
                if c.recover:
                    for got in self.run(self.read_inputs(c.session_id, view.input_seq or 0)):
                        self.apply(c.session_id, c.generation, got.record.seq)
            elif isinstance(c, RoutedInput):
                if not view.claimed:  # ahead of its Assign: the worker keeps it until the claim
                    self.pending.append(c)
                    continue
                self.apply(c.session_id, c.generation, c.seq)

    def refuse(self, c: Any, reason: str) -> None:
        rec = CommandRejected(worker_id=c.worker_id, session_id=c.session_id, command=c.TAG, reason=reason,
                              ts=self.now, generation=c.generation, seq=getattr(c, "seq", -1),
                              kind=getattr(c, "kind", ""), payload=getattr(c, "payload", ""))
        self.run(self.replicas[0].on_worker_event(rec))

    def apply(self, sid: str, gen: Any, seq: int) -> None:
        view = self.run(self.store.session(sid))
        if seq > (view.input_seq or 0):
            self.run(self.store.write_progress(sid, gen, input_seq=seq))
        self.accepted.add((sid, seq))

    # --- invariants -------------------------------------------------------------------

    @invariant()
    def never_routed_to_a_dead_owner(self) -> None:
        if hasattr(self, "bad_routes"):
            assert not self.bad_routes, self.bad_routes

    @invariant()
    def slots_within_capacity(self) -> None:
        if hasattr(self, "store"):
            for w, load in _sync_view(self.store).items():
                assert load.used <= load.capacity, (w, load)

    @precondition(lambda self: hasattr(self, "store"))
    @rule()
    def settle(self) -> None:
        """Every worker back, time passes: every obligation is met."""
        for w in WORKERS:
            if not self.alive[w]:
                self._returns(w, 0, restarted=True)
        for _ in range(6):
            self.sweep(0, False, CLAIM_GRACE_S + 1)
            self.sweep(1, False, 0.3)
        # every user comes back: an input routed to a generation that was offloaded before
        # anyone claimed it (a recovery whose Assign was lost) is owed to the restore
        for sid in sorted(self.opened - self.closed):
            view = self.run(self.store.session(sid))
            if view is not None and view.state == "suspended":
                self.run(self.replicas[0].on_session_event(SessionActive(session_id=sid, ts=self.now)))
        for _ in range(6):
            self.sweep(0, False, CLAIM_GRACE_S + 1)
            self.sweep(1, False, 0.3)
        _, due = self.run(self.store.recovery_due(self.now + 1e6, 1000))
        assert due == [], due
        for sid in self.opened:
            view = self.run(self.store.session(sid))
            if sid in self.closed:
                assert view is None or view.state == "closed", (sid, view)
            elif view is not None and view.state == "active":
                assert view.claimed and self.alive[view.generation.worker_id], (sid, view)
        unaccounted = self.pushed - self.accepted - self.refused
        assert not unaccounted, sorted(unaccounted)


def _claimed_then_frozen(m: RecoveryMachine) -> tuple[Any, str, Frozen]:
    """Session s0 opened and claimed; its owner froze it for a handoff to another worker."""
    m.open("s0", 0)
    m.deliver()
    src = m.run(m.store.session("s0")).generation
    target = next(w for w in WORKERS if w != src.worker_id)
    return src, target, Frozen(worker_id=src.worker_id, session_id="s0", generation=src, target_worker=target,
                               ts=m.now)


def test_an_input_routed_to_a_migration_source_that_dies_is_not_lost() -> None:
    """Input 1 goes to the owner; the owner freezes for a handoff and dispatch moves the
    session; the source dies with the input unread. The target replays the log after the
    frozen snapshot, so the input is applied."""
    m = RecoveryMachine()
    m.start()
    try:
        src, target, frozen = _claimed_then_frozen(m)
        m.seq["s0"] = 1
        m.pushed.add(("s0", 1))
        assert m.run(m.replicas[0].route_input("s0", 1, "text", "x", ts=m.now)) is None
        m.run(m.replicas[1].on_worker_event(frozen))
        assert m.run(m.store.session("s0")).generation.worker_id == target
        m.alive[src.worker_id] = False
        m.now += 1
        m.run(m.replicas[0].on_worker_event(WorkerDown(worker_id=src.worker_id, ts=m.now, reason="missed heartbeats")))
        m.deliver()  # the dead source's commands are gone
        m.settle()
        assert ("s0", 1) in m.accepted
    finally:
        m.teardown()


def test_a_move_whose_assign_was_lost_with_its_replica_is_sent_again() -> None:
    """The replica commits a handoff and dies before its Assign goes out; the other replica
    reads the Frozen again and sends it, so the target claims the session and serves its
    input (before, the read-again move was refused as stale and the session stayed unclaimed
    on the target, its inputs refused, until its close)."""
    m = RecoveryMachine()
    m.start()
    try:
        _src, target, frozen = _claimed_then_frozen(m)
        m.bus.lose = True
        m.run(m.replicas[0].on_worker_event(frozen))
        m.deliver()
        assert not m.run(m.store.session("s0")).claimed
        m.run(m.replicas[1].on_worker_event(frozen))
        m.deliver()
        view = m.run(m.store.session("s0"))
        assert view.generation.worker_id == target and view.claimed
        m.seq["s0"] = 1
        m.pushed.add(("s0", 1))
        assert m.run(m.replicas[0].route_input("s0", 1, "text", "x", ts=m.now)) is None
        m.deliver()
        assert ("s0", 1) in m.accepted
    finally:
        m.teardown()


def test_an_input_owed_by_a_recovery_whose_assign_was_lost_is_applied_at_the_restore() -> None:
    """Input 1 goes to the owner, which dies; the recovery's commit lands but the replica dies
    before its Assign; the user goes idle before the retry, so the unclaimed generation is
    offloaded with the input unapplied. When the user comes back the restore replays the log
    after the snapshot too (found by the state machine above)."""
    m = RecoveryMachine()
    m.start()
    try:
        m.open("s0", 0)
        m.seq["s0"] = 1
        m.pushed.add(("s0", 1))
        assert m.run(m.replicas[0].route_input("s0", 1, "text", "x", ts=m.now)) is None
        owner = m.run(m.store.session("s0")).generation.worker_id
        m.alive[owner] = False
        m.now += 1
        m.run(m.replicas[0].on_worker_event(WorkerDown(worker_id=owner, ts=m.now, reason="missed heartbeats")))
        m.sweep(0, True, 0.3)  # the recovery is committed, its Assign lost
        m.run(m.replicas[0].on_session_event(SessionIdle(session_id="s0", ts=m.now)))
        m.deliver()
        assert m.run(m.store.session("s0")).state == "suspended" and ("s0", 1) not in m.accepted
        m.settle()  # the user comes back: restored, and the log replayed after the snapshot
        assert ("s0", 1) in m.accepted
    finally:
        m.teardown()


def _sync_view(store: MemoryGenerationStore) -> Any:
    from streams.generations import _drive_sync

    return _drive_sync(store.scripts, store._ops.load_view())


TestRecovery = RecoveryMachine.TestCase
TestRecovery.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                 suppress_health_check=[HealthCheck.too_slow])
