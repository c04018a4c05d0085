"""Model-based test of the worker's ownership machine (``workers/ownership.py``) driven through
its command handler: arbitrary interleavings of inputs (duplicates, gaps, reordering, stale
and future generations, inputs naming the ones dispatch refused), gap expiry, re-assignment, a migration away, offload and close.

The store is its in-memory twin, the model a plain counter (the machine only reads
``input_seq``); no Kafka, no Redis. Invariants after every step: inputs are applied at most
once and in increasing seq order; nothing is applied by a generation that has passed (the
store's fenced input seq equals the last applied); every input delivered is accepted,
refused with a reason, waiting, or a duplicate of one applied. At the end, after a close,
nothing waits.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

import hypothesis.strategies as st
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from schemas.records import (Assign, CommandRejected, Frozen, Generation, Handoff, InputAccepted, Record,
                             Resume, Revoke, RoutedInput, Suspend, Terminate)
from streams.generations_memory import MemoryGenerationStore
from workers.commands import CommandHandler, Ports

GAP_WAIT_S = 5.0


@dataclass
class _State:
    input_seq: int = 0
    chunk_index: int = 0

    def to(self, device: str) -> "_State":
        return self


class _Model:
    def init_state(self, sid: str, prompt: str, seed: int) -> _State:
        return _State()

    def apply_input(self, state: _State, payload: str, seq: int) -> None:
        state.input_seq = seq

    def export_state(self, state: _State) -> dict[str, int]:
        return {"input_seq": state.input_seq, "chunk_index": state.chunk_index}

    def import_state(self, data: dict[str, int]) -> _State:
        return _State(**data)


def _handler(store: MemoryGenerationStore, sent: list[Record], now: Callable[[], float],
             worker_id: str = "w", logged: tuple[Any, ...] = ()) -> CommandHandler:
    """A worker's command handler on ``store``, its records sent to ``sent``, clocks ``now``;
    a recovery replays ``logged`` (``streams.input_log.LoggedInput``) after the applied seq."""
    async def send(rec: Record) -> None:
        sent.append(rec)

    async def replay(sid: str, after: int, start: Any) -> list[Any]:
        return [got for got in logged if got.record.seq > after]

    return CommandHandler(Ports(worker_id=worker_id, device="cpu", store=store, model=_Model(), send=send,
                                clock=now, monotonic=now, replay=replay, gap_wait_s=GAP_WAIT_S))


class OwnershipMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.store = MemoryGenerationStore("t")
        self.sent: list[Record] = []
        self.now = 0.0
        self.delivered: dict[int, int] = {}  # seq -> deliveries to the worker
        self.withdrawn: set[int] = set()  # seqs dispatch refused (never delivered)
        self.closed = False
        self.frozen = False
        self.handler = _handler(self.store, self.sent, lambda: self.now)
        self.run(self.store.register_worker("w", 4))
        self.run(self.store.register_worker("v", 4))
        self.gen = self.run(self.store.commit("s", 0, "w"))
        self.routed = self.gen  # the generation dispatch stamps inputs with
        self.assigned = False

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.loop.close()

    # --- rules ---------------------------------------------------------------------------

    @precondition(lambda self: not self.assigned and not self.closed)
    @rule()
    def assign(self) -> None:
        self.run(self.handler.handle(Assign(worker_id="w", session_id="s", generation=self.gen,
                                            ts=self.now, prompt="p")))
        self.assigned = True

    @precondition(lambda self: not self.closed and self.routed.worker_id == "w")
    @rule(ahead=st.integers(-2, 3), which=st.sampled_from(["current", "current", "current", "stale", "future"]))
    def deliver(self, ahead: int, which: str) -> None:
        """An input ``ahead`` of the last applied one: a duplicate (<= 0), the next (1), or
        one past a gap."""
        held = self.handler.sessions.get("s")
        seq = max(1, (held.applied_seq if held is not None else 0) + ahead)
        if seq in self.withdrawn:
            return
        gen = self.routed
        if which == "stale":
            gen = Generation(gen.worker_id, gen.epoch - 1)
        elif which == "future":
            gen = Generation("w", gen.epoch + 1)
        if which == "current":
            self.delivered[seq] = self.delivered.get(seq, 0) + 1
        self.run(self.handler.handle(RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq,
                                                 kind="text", payload=f"in {seq}", ts=self.now)))

    @precondition(lambda self: self.routed.worker_id == "v")
    @rule(seq=st.integers(1, 6))
    def deliver_to_old_owner(self, seq: int) -> None:
        """An input dispatch routed to w before it saw the move: refused, so it is routed again."""
        if seq in self.withdrawn:
            return
        self.delivered[seq] = self.delivered.get(seq, 0) + 1
        before = len(self.refused_records())
        self.run(self.handler.handle(RoutedInput(worker_id="w", session_id="s", generation=self.gen_w,
                                                 seq=seq, kind="text", payload=f"in {seq}", ts=self.now)))
        assert len(self.refused_records()) == before + 1

    @precondition(lambda self: self.assigned and not self.closed and not self.frozen
                  and self.routed.worker_id == "w")
    @rule(ahead=st.integers(2, 4))
    def deliver_past_refused(self, ahead: int) -> None:
        """Dispatch refused the inputs between the last applied and this one (over a bound) and
        names them on it: with nothing else waiting it is applied at once, not after the gap."""
        held = self.handler.sessions.get("s")
        if held is None or held.pending:
            return
        seq = held.applied_seq + ahead
        named = tuple(range(held.applied_seq + 1, seq))
        if self.withdrawn & {seq} or set(named) & set(self.delivered):
            return
        self.withdrawn.update(named)
        self.delivered[seq] = self.delivered.get(seq, 0) + 1
        self.run(self.handler.handle(RoutedInput(worker_id="w", session_id="s", generation=self.routed, seq=seq,
                                                 kind="text", payload=f"in {seq}", ts=self.now,
                                                 refused_before=named)))
        assert self.accepted()[-1:] == [seq]

    @rule(dt=st.floats(0.5, 8.0))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.run(self.handler.expire_gaps())

    @precondition(lambda self: self.assigned and not self.closed and self.routed.worker_id == "w")
    @rule(now=st.integers(0, 3))
    def migrate_away(self, now: int) -> None:
        """The session moves to worker v (dispatch commits the handoff the source froze for,
        then revokes the source): w must apply nothing more and refuse what waits."""
        if now:  # the endings are drawn rarely, so a session lives long enough to matter
            return
        self.freeze()
        if not self.frozen:
            return
        succ = self.run(self.store.commit_migration("s", self.routed, "v"))
        self.run(self.handler.handle(Revoke(worker_id="w", session_id="s", generation=self.routed,
                                            ts=self.now, reason="migrated", successor=succ)))
        self.gen_w, self.routed, self.frozen = self.routed, succ, False
        assert "s" not in self.handler.sessions

    @precondition(lambda self: self.assigned and not self.closed and self.routed.worker_id == "w"
                  and not self.frozen)
    @rule()
    def freeze(self) -> None:
        """A Handoff: the source snapshots and freezes; until dispatch answers, nothing applies."""
        self.run(self.handler.handle(Handoff(worker_id="w", session_id="s", generation=self.routed,
                                             ts=self.now, target_worker="v")))
        frozen = [r for r in self.sent if isinstance(r, Frozen)]
        self.frozen = bool(frozen) and frozen[-1].generation == self.routed and "s" in self.handler.sessions
        self.accepted_when_frozen = len(self.accepted())

    @precondition(lambda self: self.frozen and not self.closed)
    @rule()
    def handoff_refused(self) -> None:
        """The target could not take it: dispatch resumes the source, which applies what waited."""
        self.run(self.handler.handle(Resume(worker_id="w", session_id="s", generation=self.routed, ts=self.now)))
        self.frozen = False

    @precondition(lambda self: not self.closed and self.routed.worker_id == "w")
    @rule(now=st.integers(0, 3))
    def suspend(self, now: int) -> None:
        """An offload; before the Assign it overtakes it (they come from different agents)."""
        if now:
            return
        self.run(self.handler.handle(Suspend(worker_id="w", session_id="s", generation=self.routed,
                                             ts=self.now)))
        assert "s" not in self.handler.sessions or self.handler.sessions["s"].generation != self.routed
        self.closed = True  # offloaded: nothing more reaches this generation

    @precondition(lambda self: not self.closed)
    @rule(now=st.integers(0, 3))
    def close(self, now: int) -> None:
        """A close; before the Assign it overtakes it."""
        if now:
            return
        self.run(self.handler.handle(Terminate(worker_id=self.routed.worker_id, session_id="s",
                                               generation=self.routed, ts=self.now)))
        self.closed = True

    # --- invariants ----------------------------------------------------------------------

    def accepted(self) -> list[int]:
        return [r.seq for r in self.sent if isinstance(r, InputAccepted)]

    def refused_records(self) -> list[CommandRejected]:
        return [r for r in self.sent if isinstance(r, CommandRejected) and r.command == RoutedInput.TAG]

    def refused(self) -> set[int]:
        return {r.seq for r in self.refused_records()}

    @invariant()
    def applied_once_in_order(self) -> None:
        if not hasattr(self, "sent"):
            return
        acc = self.accepted()
        assert acc == sorted(set(acc)), acc
        held = self.handler.sessions.get("s")
        if acc and held is not None:
            view = self.run(self.store.session("s"))
            assert view is not None and view.input_seq == acc[-1]  # fenced: the store agrees

    @invariant()
    def nothing_unaccounted(self) -> None:
        if not hasattr(self, "sent"):
            return
        acc, ref = set(self.accepted()), self.refused()
        held = self.handler.sessions.get("s")
        waiting = set(held.pending) if held is not None else set()
        early = set(self.handler.early.waiting("s"))
        for seq in self.delivered:
            assert seq in acc or seq in ref or seq in waiting or seq in early, (seq, acc, ref, waiting, early)

    @precondition(lambda self: self.assigned and not self.closed and self.routed.worker_id == "w")
    @invariant()
    def an_owner_keeps_its_session(self) -> None:
        """Nothing but a move, an offload or a close takes the session from its owner."""
        held = self.handler.sessions.get("s")
        assert held is not None and held.generation == self.routed

    @precondition(lambda self: self.frozen and not self.closed)
    @invariant()
    def nothing_applied_while_frozen(self) -> None:
        assert len(self.accepted()) == self.accepted_when_frozen

    @precondition(lambda self: self.closed and not self.assigned and self.routed.worker_id == "w")
    @rule()
    def late_assign(self) -> None:
        """The Assign a close or an offload overtook arrives: nothing to run."""
        self.run(self.handler.handle(Assign(worker_id="w", session_id="s", generation=self.gen,
                                            ts=self.now, prompt="p")))
        self.assigned = True
        assert "s" not in self.handler.sessions

    @precondition(lambda self: self.closed)
    @invariant()
    def nothing_waits_on_a_closed_session(self) -> None:
        """Not in the held session, nor among inputs that came before an Assign the close or
        offload overtook: each was accepted or refused, so dispatch settles it."""
        held = self.handler.sessions.get("s")
        assert held is None or held.generation != self.routed or not held.pending
        assert not self.handler.early.waiting("s", self.routed), self.handler.early.waiting("s", self.routed)


def test_an_input_before_an_assign_that_never_comes_is_refused_after_the_gap_wait():
    """Dispatch routed it under a generation whose Assign is lost or late: the worker hands
    it back (not_owner) after the wait, so dispatch routes it again instead of it waiting
    for ever."""
    loop = asyncio.new_event_loop()
    try:
        store, sent, now = MemoryGenerationStore("t"), [], [0.0]
        handler = _handler(store, sent, lambda: now[0])
        loop.run_until_complete(store.register_worker("w", 4))
        gen = loop.run_until_complete(store.commit("s", 0, "w"))
        loop.run_until_complete(handler.handle(RoutedInput(worker_id="w", session_id="s", generation=gen, seq=1,
                                                           kind="text", payload="hi", ts=0.0)))
        assert handler.early.waiting("s") == [1] and not sent
        now[0] = GAP_WAIT_S - 0.1
        loop.run_until_complete(handler.expire_gaps())
        assert handler.early.waiting("s") == [1] and not sent
        now[0] = GAP_WAIT_S + 0.1
        loop.run_until_complete(handler.expire_gaps())
        assert handler.early.waiting("s") == []
        assert [(r.command, r.reason, r.seq) for r in sent] == [(RoutedInput.TAG, "not_owner", 1)]
    finally:
        loop.close()


OwnershipMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_worker_ownership = OwnershipMachine.TestCase
