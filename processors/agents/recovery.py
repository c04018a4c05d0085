"""Recovery, carried out by dispatch: a durable obligation, not a call.

A worker declared dead is marked down in the store and every session it held is queued
(``strand``); every dispatch replica sweeps the queue, earliest first, until each session has
a new owner that claimed it or its user closed it (``processors.recovery.next_step`` decides
each step). The obligations are kept in the store, not in a replica's memory: a replica that
dies mid-recovery leaves the queue to the others. (What a replica remembers is which inputs it
refused already: a close's sweep by another replica may refuse one of those again.)
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from typing import Any, Awaitable, Callable, Protocol

from schemas.errors import NoCapacityError, OwnershipError
from schemas.records import Assign, Generation

from ..admission import WorkerLoad, candidate
from ..recovery import CLAIM_GRACE_S, RECOVERIES, Step, next_step, outlived, waits


class Shell(Protocol):
    """What the recovery uses of its dispatch replica (``agents.dispatch.DispatchShell``)."""

    store: Any
    publisher: Any
    view: Any  # its DispatchView: the policy's admission plan
    name: str
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    read_inputs: Callable[[str, int], Awaitable[list[Any]]] | None
    gate: Any  # its InputGate: the seqs refused already
    dead_letters: Any  # its DeadLetterOnce
    inputs_topic: str

    async def load_view(self, force: bool = False) -> dict[str, WorkerLoad]: ...
    def invalidate_view(self) -> None: ...
    async def is_down(self, worker: str) -> bool: ...
    async def report(self, worker: str, began: float) -> None: ...
    async def refuse_input(self, sid: str, seq: int, kind: str, payload: str, ts: float,
                           why: str, partition: int = 0, offset: int = 0) -> None: ...

__all__ = ["Recovery"]

log = logging.getLogger(__name__)

# how long a replica that took a closed session's refusals has them before another may redo them
CLOSE_TAKE_S = 30.0
# how often a replica deregisters the workers down for longer than the store's retention
FORGET_EVERY_S = 60.0
# how far ahead of this replica's clock a worker's sign of life counts (``outlived``): a heartbeat
# stamped hours ahead (a clock stepped, a host far off) made every later death of it read as outlived
ALIVE_AHEAD_S = 5.0


class Recovery:
    """The recovery side of one dispatch replica (``DispatchShell.recovery``)."""

    def __init__(self, shell: Shell) -> None:
        self.shell = shell
        self.queued = 0  # sessions owing a recovery (or its claim) at the last sweep
        self._forgot_at = -1e18
        # each worker's latest sign of life this replica read (its worker-events partition's
        # heartbeats and starts, in log order, before any WorkerDown of it)
        self.alive_at: dict[str, float] = {}

    async def worker_down(self, worker: str, ts: float) -> int:
        """A worker was declared dead (or stopped): mark it down and queue every session it
        still holds for recovery. Done in the store before this returns, so the event may be
        marked read: any replica's sweep carries the recoveries out. A declaration the worker
        outlived (``outlived``: a copy of an earlier one written again) is not acted on."""
        if outlived(ts, self.alive_at.get(worker)):
            log.warning("%s: a WorkerDown of %s at %.3f is older than its sign of life at %.3f read before it "
                        "(a copy written again, or a declaration it outlived): not acted on",
                        self.shell.name, worker, ts, self.alive_at[worker])
            return 0
        if not await self.shell.store.set_down(worker, ts):
            return 0  # deregistered already (a clean shutdown): nothing to recover
        self.shell.invalidate_view()
        queued = await self.shell.store.strand(worker, self.shell.clock())
        log.info("%s: %s declared down; %d sessions queued for recovery", self.shell.name, worker, queued)
        return queued

    async def worker_alive(self, worker: str, ts: float) -> None:
        """A sign of life: remembered (a later death must not be older, ``outlived``), and from
        a worker marked down, later than the declaration, its slots count again (its stale
        generations were fenced by the recoveries)."""
        seen = min(ts, self.shell.clock() + ALIVE_AHEAD_S)  # a clock far ahead masks no later death
        self.alive_at[worker] = max(seen, self.alive_at.get(worker, seen))
        if await self.shell.is_down(worker) and await self.shell.store.set_up(worker, ts):
            self.shell.invalidate_view()
            log.info("%s: %s is back; its slots count again", self.shell.name, worker)

    async def sweep(self, limit: int = 64) -> Counter[str]:
        """One pass over the recovery queue, run periodically by every replica: queue the
        sessions still on workers marked down, then take each due entry one step, earliest
        first. A session that finds no free slot waits, and every later one with it. Once a
        minute it also deregisters the workers down for longer than the store's retention."""
        now = self.shell.clock()
        if now - self._forgot_at >= FORGET_EVERY_S:
            self._forgot_at = now
            gone = await self.shell.store.forget_down(now)
            if gone:
                log.info("%s: forgot %s (down longer than the retention)", self.shell.name, ", ".join(gone))
                for worker in gone:
                    self.alive_at.pop(worker, None)
        view = await self.shell.load_view(force=True)
        for worker, load in view.items():
            if load.down and load.used:
                await self.shell.store.strand(worker, now)
        self.queued, due = await self.shell.store.recovery_due(now, limit)
        steps: Counter[str] = Counter()
        waiting = False
        for sid, at in due:
            sv = await self.shell.store.session(sid)
            owner = view.get(sv.generation.worker_id) if sv is not None else None
            owner_down = owner is None or owner.down
            step = next_step(sv, owner_down)
            if waits(step, waiting):
                continue
            done = await self._carry_out(step, sid, sv, now, at)
            waiting = waiting or (step in RECOVERIES and not done)
            steps[step.value if done else "waiting"] += 1
        return steps

    async def _carry_out(self, step: Step, sid: str, sv: Any, now: float, at: float) -> bool:
        """Carry out one step decided on the entry queued for ``at``: every change of the queue
        is made only while the entry is still that one (its new owner may have died meanwhile,
        and ``strand`` queued it again: that newer entry stays)."""
        store = self.shell.store
        if step is Step.DROP:
            await store.recovery_mark(sid, None, expected=at)
            return True
        if step in (Step.CLOSE, Step.REFUSE):
            # one replica refuses the inputs (each replica's dead letters are its own), and the
            # entry leaves the queue only once they are sent: a replica dying midway leaves
            # them to the next one's sweep after CLOSE_TAKE_S (sent again: at least once)
            until = now + CLOSE_TAKE_S
            if not await store.recovery_take(sid, now, until):
                return True  # another replica's sweep has it
            if step is Step.CLOSE:
                try:
                    await store.release(sid, sv.generation, close=True)
                except OwnershipError:
                    await store.recovery_mark(sid, now, expected=until)  # moved meanwhile: the next sweep reads it again
                    return False
            final = await store.session(sid)  # closed now: no owner can apply more (the sweep's read may be older)
            await self._refuse_unapplied(sid, (final or sv).input_seq or 0)
            await store.recovery_mark(sid, None, expected=until)
            return True
        if step in RECOVERIES:
            began = self.shell.monotonic()  # the slot's commit: counted once in dispatch's cached loads
            try:
                gen = await self._commit_in_place(sid, sv.generation) if step is Step.TAKE_BACK else None
                gen = gen or await self._commit_planned(sid, sv.generation.epoch)
            except OwnershipError:  # another replica moved it, or its user closed it
                return True
            if gen is None:
                return False
            await store.recovery_mark(sid, now + CLAIM_GRACE_S, expected=at)
            await self._assign_recovered(sid, gen, began)
            log.info("%s: session %s recovered on %s", self.shell.name, sid, gen)
            return True
        if await store.recovery_mark(sid, now + CLAIM_GRACE_S, expected=at):  # RESEND (not when queued again)
            await self._assign_recovered(sid, sv.generation, -math.inf)  # its slot was counted when committed
        return True

    async def _commit_planned(self, sid: str, expected_epoch: int) -> Generation | None:
        """The recovery's commit, on the worker an admission would take (the policy's plan,
        :func:`~processors.admission.candidate`), the next one when that one is full; None
        when none is left (the next sweep tries again, by then maybe with the policy's pin).
        Refusals other than capacity raise."""
        tried: set[str] = set()
        while True:
            workers = await self.shell.load_view(force=bool(tried))
            best = candidate(self.shell.view.plan, workers, sid, frozenset(tried))
            if best is None:
                return None
            try:
                return await self.shell.store.commit(sid, expected_epoch, best)
            except NoCapacityError:
                tried.add(best)

    async def _commit_in_place(self, sid: str, gen: Generation) -> Generation | None:
        try:
            return await self.shell.store.commit(sid, gen.epoch, gen.worker_id)
        except NoCapacityError:  # draining, or its slot is gone
            return None

    async def _assign_recovered(self, sid: str, gen: Generation, began: float) -> None:
        await self.shell.publisher.send(Assign(worker_id=gen.worker_id, session_id=sid, generation=gen,
                                               ts=self.shell.clock(), restore=True, recover=True))
        await self.shell.report(gen.worker_id, began)

    async def _refuse_unapplied(self, sid: str, applied_seq: int) -> None:
        """A session closed while its owner was lost: every input after the last one applied
        is still in the log; refuse each with the reason, but for those refused already (an
        owner that was alive after all refused them at the close: each was dead-lettered once)."""
        if self.shell.read_inputs is None:
            return
        done = set(self.shell.gate.recently_refused(sid, below=2**63))
        for got in await self.shell.read_inputs(sid, applied_seq):
            rec = got.record
            if rec.seq in done:
                continue
            self.shell.gate.note_refused(sid, rec.seq)  # refused again later (handed back): not twice
            await self.shell.dead_letters.send(  # once per place, as every other refusal of this process
                (self.shell.inputs_topic, got.partition, got.offset),
                lambda rec=rec, got=got: self.shell.refuse_input(
                    sid, rec.seq, rec.kind, rec.payload, rec.ts,
                    f"refused: session closed before input {rec.seq} was applied (its worker was lost and no "
                    "new owner took it)", got.partition, got.offset))

