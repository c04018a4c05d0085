"""The commands a worker carries out for its sessions: claim, inputs, offload, handoff, stop.

Each command is checked by the ownership machine (``ownership.py``) and every step that
advances a session is fenced in the store (claim, input seq, snapshot, release); a worker
that learns its generation has passed drops the session at once, and the inputs it held
are refused so dispatch routes them to the current owner.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from schemas.errors import ChunkserveError, LimitError, OwnershipError
from schemas.records import (Assign, RejectReason, ReleaseReason, Claimed, CommandRejected, Frozen, Generation, Handoff,
                             InputAccepted, Record, Released, Resume, Revoke, RoutedInput, Suspend,
                             Terminate)
from streams.prom import metrics

from .ownership import EarlyInputs, Held, Refusal, command_refusal, stray_input_refusal
from .schedule import Schedule
from . import snapshots

__all__ = ["Ports", "CommandHandler", "session_seed"]

log = logging.getLogger(__name__)


def session_seed(session_id: str) -> int:
    """The session's noise seed: a stable function of its id, so any owner reproduces it."""
    return zlib.crc32(session_id.encode())


@dataclass(frozen=True)
class Ports:
    """What the handler talks to: the store, the model, the outgoing events, the clocks, and
    the session-inputs log (``replay(sid, after_seq, start)``)."""

    worker_id: str
    device: str
    store: Any
    model: Any
    send: Callable[[Record], Awaitable[None]]
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    replay: Callable[[str, int, tuple[int, int] | None], Awaitable[list[Any]]]
    gap_wait_s: float = 5.0
    host_cache_sessions: int = 64
    # wait until every event sent so far is acknowledged: the inputs applied are reported
    # before an offload, a handoff or a close makes the state others act on (no replay then)
    flush: Callable[[], Awaitable[None]] = field(default=lambda: asyncio.sleep(0))


async def initial_state(p: Ports, host_cache: Any, rec: Assign) -> snapshots.Restored:
    """A new session's state, or its last snapshot when the Assign restores it (from host
    memory when it holds that one); with the input position it was taken at and the seqs
    given up on before it."""
    if rec.restore:
        got = await snapshots.restore(p.store, p.model, p.device, rec.session_id, host_cache)
        if got is not None:
            return got
    return p.model.init_state(rec.session_id, rec.prompt, session_seed(rec.session_id)), (-1, -1), ()


OWED = "its recovery's inputs are not read from session-inputs yet (the broker away): it stays here until they are"


class Replays:
    """A session's inputs read back from ``session-inputs``: a recovery's after its snapshot,
    read beside the serving loop while the session waits (no chunk, no input applied; read
    again each heartbeat while the broker cannot be read), and a gap's (:meth:`fill_gap`).
    A failed read ended the worker before, and each read held up every session it served
    (a review found both: a broker blip during a recovery took down each survivor)."""

    def __init__(self, ports: Ports, schedule: Schedule) -> None:
        self.p, self.schedule = ports, schedule
        self.reading: dict[str, tuple[Held, asyncio.Future[list[Any] | None]]] = {}

    async def read(self, sid: str, sess: Held) -> list[Any] | None:
        """The session's inputs after its last applied one; None when the broker cannot be read."""
        try:
            return await self.p.replay(sid, sess.applied_seq, sess.input_pos if sess.input_pos[0] >= 0 else None)
        except Exception as exc:  # noqa: BLE001 - the broker away
            log.warning("%s: reading %s's inputs from the log failed: %s", self.p.worker_id, sid, exc)
            return None

    def recover(self, sid: str, sess: Held) -> None:
        """Start reading a recovery's inputs after the snapshot; the session waits until
        they are offered (:meth:`done`)."""
        sess.owe_replay()
        self.reading[sid] = (sess, asyncio.ensure_future(self.read(sid, sess)))

    def _offer(self, sid: str, sess: Held, logged: list[Any]) -> None:
        sess.offer_logged(logged, self.p.worker_id, self.p.clock(), self.p.gap_wait_s)
        sess.replayed(self.p.monotonic())
        self.schedule.add(sid, sess)

    def done(self, sessions: dict[str, Held]) -> list[str]:
        """Offer the recoveries' inputs read since: the sessions that run now (a read that
        failed is started again by :meth:`owed`; one of a session gone meanwhile is dropped)."""
        ready = []
        for sid, (sess, reading) in list(self.reading.items()):
            if reading.done():
                del self.reading[sid]
                if sessions.get(sid) is sess and sess.replay_owed and (logged := reading.result()) is not None:
                    self._offer(sid, sess, logged)
                    ready.append(sid)
        return ready

    async def settled(self, sid: str, sess: Held) -> bool:
        """Whether the session owes no replay (read now if it did, or the read on its way
        waited for): an offload or a handoff waits for it, as its snapshot must hold every input."""
        if not sess.replay_owed:
            return True
        on_way = self.reading.pop(sid, None)
        logged = await on_way[1] if on_way is not None and on_way[0] is sess else await self.read(sid, sess)
        if logged is not None:
            self._offer(sid, sess, logged)
        return logged is not None

    def owed(self, sessions: dict[str, Held]) -> None:
        """Read again the recoveries' inputs whose read failed (each heartbeat)."""
        for sid, sess in sessions.items():
            if sess.replay_owed and sid not in self.reading:
                self.recover(sid, sess)

    async def fill_gap(self, sid: str, sess: Held) -> None:
        """Offer the inputs up to the last one waiting as ``session-inputs`` holds them: a routed
        copy is lost when the owner it went to (one the session had just left) is killed before
        handing it back. Only when the broker cannot be read is the gap given up on without it."""
        if sess.has_gap() and (logged := await self.read(sid, sess)) is not None:
            sess.offer_logged(logged, self.p.worker_id, self.p.clock(), self.p.gap_wait_s, upto=max(sess.pending))


class CommandHandler:
    """The sessions a worker holds and the commands on them."""

    def __init__(self, ports: Ports) -> None:
        self.p = ports
        self.sessions: dict[str, Held] = {}
        self.schedule = Schedule(self.sessions)
        self.early = EarlyInputs()
        self.replays = Replays(ports, self.schedule)
        # offloaded sessions kept in host memory, by snapshot id: a resume here skips Redis
        self.host_cache: OrderedDict[str, tuple[str, snapshots.Restored]] = OrderedDict()

    async def handle(self, rec: Record) -> None:
        match rec:
            case Assign():
                await self.on_assign(rec)
            case RoutedInput():
                await self.on_input(rec)
            case Terminate() | Revoke():
                await self.on_stop(rec)
            case Suspend():
                await self.on_suspend(rec)
            case Handoff():
                await self.on_handoff(rec)
            case Resume():  # the user is back, or a handoff was refused: run (again)
                if (sess := await self.current(rec)) is not None:
                    sess.thaw(self.p.monotonic())
                    self.schedule.add(rec.session_id, sess)
                    await self.apply_pending(rec.session_id, sess)

    async def reject(self, rec: Record, reason: RejectReason, detail: str = "") -> None:
        metrics().rejected.labels(reason).inc()
        await self.p.send(CommandRejected(
            worker_id=self.p.worker_id, session_id=getattr(rec, "session_id", ""),
            command=rec.TAG, reason=reason, ts=self.p.clock(),
            generation=getattr(rec, "generation", None), seq=getattr(rec, "seq", -1),
            detail=detail[:500], kind=getattr(rec, "kind", ""), payload=getattr(rec, "payload", "")))

    async def refuse(self, rec: Record, why: Refusal) -> None:
        await self.reject(rec, why.reason, why.detail)

    async def released(self, sid: str, gen: Generation, reason: ReleaseReason, chunk_index: int = -1,
                       successor: Generation | None = None, detail: str = "") -> None:
        await self.p.send(Released(worker_id=self.p.worker_id, session_id=sid, generation=gen,
                                   ts=self.p.clock(), reason=reason, chunk_index=chunk_index,
                                   successor=successor, detail=detail[:500]))

    async def on_assign(self, rec: Assign) -> None:
        sid, held = rec.session_id, self.sessions.get(rec.session_id)
        if held is not None and held.generation == rec.generation:
            current = await self.p.store.current(sid)
            if current != rec.generation:  # a replay of a generation that has passed
                await self.reject(rec, "stale_epoch" if current is not None else "unknown_session",
                                  f"generation {rec.generation} has passed (now {current})")
            return  # else a duplicate delivery of the command being served
        try:
            await self.p.store.claim(sid, rec.generation)
        except OwnershipError as exc:
            await self.reject(rec, exc.reason_code, str(exc))
            await self.reject_all(self.early.take(sid, rec.generation), "not_owner", f"its Assign was refused: {exc}")
            return
        if held is not None:  # we held an older generation of the same session: it has passed
            self.sessions.pop(sid)
            await self.reject_all(held.take_pending(), "stale_epoch", f"superseded by {rec.generation}")
        try:
            state, input_pos, skipped = await initial_state(self.p, self.host_cache, rec)
        except ChunkserveError as exc:  # corrupt, vanished, or over max_snapshot_bytes
            await self.reject(rec, exc.reason_code, str(exc))
            try:
                await self.p.store.release(sid, rec.generation, close=False)
            except OwnershipError:
                pass
            await self.reject_all(self.early.take(sid, rec.generation), "not_owner", f"its session did not start here: {exc}")
            return
        sess = Held(rec.generation, state, next_due=self.p.monotonic(), input_pos=input_pos, skipped=set(skipped))
        self.sessions[sid] = sess
        self.schedule.add(sid, sess)
        if rec.recover:  # the inputs after the snapshot, from the log, read beside the serving loop
            self.replays.recover(sid, sess)
        await self.p.send(Claimed(worker_id=self.p.worker_id, session_id=sid,
                                  generation=rec.generation, ts=self.p.clock()))
        for other in self.early.hand_over(sid, sess):
            await self.reject(other, "stale_epoch", f"held: {sess.generation}")
        await self.apply_pending(sid, sess)

    async def snapshot(self, sid: str, sess: Held) -> Any:
        return await snapshots.take(self.p.store, self.p.model, sid, sess)

    async def on_suspend(self, rec: Suspend) -> None:
        """Offload: device -> host -> fenced snapshot in Redis, then free the slot."""
        sid = rec.session_id
        if (sess := await self.current(rec)) is None:
            return
        if not await self.replays.settled(sid, sess):
            await self.reject(rec, "error", OWED)
            return
        sess.frozen_since = None  # an offload overrides a handoff: it keeps the inputs
        # a snapshot keeps no waiting input: what waits on a gap is applied past it (the seqs given up on travel)
        await self.apply_pending(sid, sess, skip_gaps=True)
        if self.sessions.get(sid) is not sess:
            return  # fenced meanwhile
        try:
            sess.state.to("cpu")
            manifest = await self.snapshot(sid, sess)
            await self.p.flush()
            await self.p.store.release(sid, sess.generation, close=False)
        except LimitError as exc:  # cannot offload: the session stays resident and says why
            sess.state.to(self.p.device)
            await self.reject(rec, exc.reason_code, str(exc))
            return
        except OwnershipError as exc:
            await self.drop(sid, sess, str(exc))
            return
        self.sessions.pop(sid, None)
        self.host_cache[sid] = (manifest.snap_id, (sess.state, sess.input_pos, tuple(sorted(sess.skipped))))
        while len(self.host_cache) > self.p.host_cache_sessions:
            self.host_cache.popitem(last=False)
        await self.released(sid, sess.generation, "suspended", sess.released_chunk)

    async def on_handoff(self, rec: Handoff) -> None:
        """Migrate at this boundary: freeze, snapshot (fenced), report; dispatch moves or resumes it."""
        sid = rec.session_id
        if (sess := await self.current(rec)) is None:
            return
        if not await self.replays.settled(sid, sess):
            await self.reject(rec, "error", OWED)
            return
        if sess.frozen_since is None:  # a duplicate Handoff while frozen reports again
            await self.apply_pending(sid, sess)  # what is in order goes into the snapshot
            try:
                await self.snapshot(sid, sess)
            except LimitError as exc:  # its state cannot travel through Redis: keep serving here
                await self.reject(rec, exc.reason_code, str(exc))
                return
            except OwnershipError as exc:
                await self.drop(sid, sess, str(exc))
                return
            sess.freeze(self.p.monotonic())
        await self.p.flush()
        await self.p.send(Frozen(worker_id=self.p.worker_id, session_id=sid, generation=sess.generation,
                                 target_worker=rec.target_worker, ts=self.p.clock(),
                                 chunk_index=sess.released_chunk))

    async def current(self, rec: Record) -> Held | None:
        """The held session if ``rec`` carries its generation; otherwise reject ``rec``. A
        Terminate or Suspend may overtake the Assign of the same generation (they come from
        different agents): if the store says the generation is current and ours, the session
        is ended or suspended in the store directly, so the late Assign finds nothing to run."""
        sid, gen = rec.session_id, rec.generation  # type: ignore[attr-defined]
        sess = self.sessions.get(sid)
        if (sess is None and isinstance(rec, (Terminate, Suspend)) and gen.worker_id == self.p.worker_id
                and await self.p.store.current(sid) == gen):
            close = isinstance(rec, Terminate)
            try:
                await self.p.store.release(sid, gen, close=close)
            except OwnershipError as exc:
                await self.reject(rec, exc.reason_code, str(exc))
                return None
            await self.reject_all(self.early.take(sid, gen), "closed" if close else "not_owner", "ended before its Assign ran here")
            await self.released(sid, gen, "closed" if close else "suspended")
            return None
        refusal = command_refusal(sess.generation if sess is not None else None, gen)
        if refusal is not None:
            await self.refuse(rec, refusal)
            return None
        return sess

    async def on_input(self, rec: RoutedInput) -> None:
        sess = self.sessions.get(rec.session_id)
        if sess is None:  # not held here: wait for the Assign, or let dispatch route it again
            view = await self.p.store.session(rec.session_id)
            refusal = stray_input_refusal(rec, view.state if view else None,
                                          view.generation if view else None)
            if refusal is not None:
                await self.refuse(rec, refusal)
                return
        if sess is None or sess.generation.epoch < rec.generation.epoch:
            if (refusal := self.early.keep(rec, self.p.monotonic())) is not None:
                await self.refuse(rec, refusal)
            return
        if (refusal := sess.offer(rec, self.p.gap_wait_s)) is not None:
            await self.refuse(rec, refusal)
            return
        await self.apply_pending(rec.session_id, sess)

    async def apply_pending(self, sid: str, sess: Held, skip_gaps: bool = False) -> None:
        """Apply the waiting inputs in order, each fenced in the store first; ``skip_gaps``
        (after the gap wait, or at an offload) past a missing one not found in the log."""
        if skip_gaps:
            await self.replays.fill_gap(sid, sess)
        while (rec := sess.next_input(self.p.monotonic(), skip_gaps)) is not None:
            try:  # with the seqs given up on, when there are new ones (see Held.skipped_news)
                await self.p.store.set_input_seq(sid, sess.generation, rec.seq, sess.skipped_news())
            except OwnershipError as exc:
                sess.pending[rec.seq] = rec
                await self.drop(sid, sess, str(exc))
                return
            self.p.model.apply_input(sess.state, rec.payload, rec.seq)
            sess.applied(rec)
            await self.p.send(InputAccepted(worker_id=self.p.worker_id, session_id=sid,
                                            generation=sess.generation, seq=rec.seq, ts=self.p.clock()))

    async def expire_gaps(self) -> int:
        """Apply the inputs after a missing one waited for long enough (it is refused as late if
        it comes), and read again the recoveries' inputs whose read failed. Returns how many gaps."""
        self.replays.owed(self.sessions)
        now = self.p.monotonic()
        due = [(sid, s) for sid, s in self.sessions.items() if s.gap_expired(now, self.p.gap_wait_s)]
        for sid, sess in due:
            await self.apply_pending(sid, sess, skip_gaps=True)
        await self.reject_all(self.early.expired(now, self.p.gap_wait_s), "not_owner", "no Assign of its generation came in time")
        return len(due)

    async def replayed(self) -> None:
        """Sessions whose recovery's inputs were read since: offered, and what waited goes in."""
        for sid in self.replays.done(self.sessions):
            if (sess := self.sessions.get(sid)) is not None:
                await self.apply_pending(sid, sess)

    async def reject_all(self, recs: list[RoutedInput], reason: RejectReason, detail: str) -> None:
        """Refuse inputs this worker will not apply: dispatch routes each again or refuses it."""
        for rec in recs:
            await self.reject(rec, reason, detail)

    async def on_stop(self, rec: Terminate | Revoke) -> None:
        if (sess := await self.current(rec)) is None:
            return
        close, successor = isinstance(rec, Terminate), getattr(rec, "successor", None)
        if close:  # inputs still waiting for an earlier one are not applied: refused
            await self.reject_all(sess.take_pending(), "closed", "the session closed while it waited for an earlier one")
        if successor is None:  # (after a handoff the store moved it already)
            try:
                await self.p.flush()
                await self.p.store.release(rec.session_id, rec.generation, close=close)
            except OwnershipError as exc:
                log.info("release of %s refused: %s", rec.session_id, exc)
        self.sessions.pop(rec.session_id, None)
        await self.reject_all(sess.take_pending(), "stale_epoch", f"the session moved to {successor}" if successor
                              else "the session was revoked here")
        reason: ReleaseReason = "closed" if close else "migrated" if successor is not None else "revoked"
        await self.released(rec.session_id, rec.generation, reason, sess.released_chunk, successor,
                            detail=getattr(rec, "reason", "") if reason == "revoked" else "")

    async def drop(self, sid: str, sess: Held, why: str) -> None:
        """Forget a session whose generation the store fenced (``why``: the refusal); its
        waiting inputs are refused as stale, so dispatch routes them to the current owner."""
        if self.sessions.get(sid) is sess:
            del self.sessions[sid]
        await self.reject_all(sess.take_pending(), "stale_epoch", f"fenced: {why}")
        await self.released(sid, sess.generation, "fenced", sess.released_chunk, detail=why)
