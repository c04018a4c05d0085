"""The worker's shell for its sessions: carries out what its core decides (``core.py``).

Each command, input or timer goes to ``WorkerCore.decide``; the commands it returns (claim,
read, fence an input and apply it, snapshot, offload, release, send) are carried out here, in
order and depth first, each answer fed back as an event. Every step that advances a session
is fenced in the store (claim, input seq, snapshot, release); a worker that learns its
generation has passed drops the session at once, and the inputs it held are refused so
dispatch routes them to the current owner. A recovery's inputs are read from the log beside
the serving loop (a failed read ended the worker before, and each read held up every session
it served: a review found both).
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

from schemas.errors import ChunkserveError, LimitError, OwnershipError
from schemas.records import CommandRejected, Record, RejectReason, Terminate
from streams.prom import metrics

from .core import WorkerCore
from .core_types import (OWED, ApplyInput, At, AwaitLog, Claim, ClaimAnswered, Command, CurrentIs, EndedInStore, EndInStore,
                         Event, FreezeCheck, FreezeExpired, Flush, GapCheck, GapExpired, GapRead, Got, InputApplied,
                         InputFenced, Loaded, LoadState, LogRead, Note, Offload, Offloaded, ReadCurrent, ReadGap, ReadLog,
                         ReadSession, Release, Send, SessionRead, Snapshot, Snapshotted, SnapshotRefused, Then,
                         Unauthentic)
from .ownership import Held, Refusal
from . import snapshots

__all__ = ["Ports", "CommandHandler", "session_seed", "OWED"]

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


def _refusal(exc: ChunkserveError) -> Refusal:
    return Refusal(exc.reason_code, str(exc))


def _kept(logged: list[Any] | None) -> tuple[Any, ...] | None:
    """A log read as the core takes it: the inputs read, or None when the broker could not be read."""
    return tuple(logged) if logged is not None else None


class CommandHandler:
    """Feeds the worker's core and carries out its commands; holds what the core must not:
    the recoveries' log reads on their way and the offloaded states kept in host memory."""

    def __init__(self, ports: Ports) -> None:
        self.p = ports
        self.core = WorkerCore(ports.worker_id, ports.gap_wait_s)
        self.sessions, self.schedule, self.early = self.core.sessions, self.core.schedule, self.core.early
        # a recovery's inputs read from the log beside the serving loop, by session
        self.reading: dict[str, tuple[Held, asyncio.Future[list[Any] | None]]] = {}
        # offloaded sessions kept in host memory, by snapshot id: a resume here skips Redis
        self.host_cache: OrderedDict[str, tuple[str, snapshots.Restored]] = OrderedDict()

    def at(self) -> At:
        return At(self.p.monotonic(), self.p.clock())

    async def feed(self, event: Event) -> list[Command]:
        """Decide ``event`` and carry out every command it leads to, depth first (an answer's
        commands before the ones after the command it answered); returns the commands decided
        for ``event`` itself."""
        first = self.core.decide(event, self.at())
        todo = deque(first)
        while todo:
            answer = await self.carry_out(todo.popleft())
            if answer is not None:
                todo.extendleft(reversed(self.core.decide(answer, self.at())))
        return first

    async def handle(self, rec: Record) -> None:
        await self.feed(Got(rec))

    async def unauthentic(self, rec: Record, reason: RejectReason) -> None:
        """Refuse a command that failed its authenticity check (unsigned, unknown key, forged)."""
        await self.feed(Unauthentic(rec, reason))

    async def expire_gaps(self) -> int:
        """Each heartbeat: apply the inputs after a missing one waited for long enough, read
        again the recoveries' inputs whose read failed, refuse early inputs whose Assign never
        came. Returns how many gaps were given up on."""
        return sum(isinstance(c, Then) and isinstance(c.event, GapExpired) for c in await self.feed(GapCheck()))

    async def thaw_stuck(self, wait_s: float) -> int:
        """Sessions frozen for a handoff nobody completed within ``wait_s`` run here again."""
        return sum(isinstance(c, Then) and isinstance(c.event, FreezeExpired)
                   for c in await self.feed(FreezeCheck(wait_s)))

    async def replayed(self) -> None:
        """Sessions whose recovery's inputs were read since: offered, and what waited goes in."""
        for sid, (sess, reading) in list(self.reading.items()):
            if reading.done():
                del self.reading[sid]
                logged = reading.result()
                await self.feed(LogRead(sid, sess, _kept(logged)))

    # --- carrying commands out ---------------------------------------------------------------

    async def carry_out(self, cmd: Command) -> Event | None:
        """Do ``cmd``; its answer, when the core asked for one."""
        match cmd:
            case Send(rec=rec):
                if isinstance(rec, CommandRejected):
                    metrics().rejected.labels(rec.reason).inc()
                await self.p.send(rec)
            case Flush():
                await self.p.flush()
            case Note(text=text, level=level, reason=reason):
                if reason:
                    metrics().rejected.labels(reason).inc()
                log.log(logging.WARNING if level == "warning" else logging.INFO, "%s", text)
            case Then(event=event):
                return event
            case ReadGap(sid=sid, held=sess):
                logged = await self._read(sid, sess)
                return GapRead(sid, sess, _kept(logged))
            case ReadLog(sid=sid, held=sess):  # beside the serving loop; :meth:`replayed` feeds it back
                self.reading[sid] = (sess, asyncio.ensure_future(self._read(sid, sess)))
            case AwaitLog(sid=sid, held=sess, then=then):
                on_way = self.reading.pop(sid, None)
                logged = await on_way[1] if on_way is not None and on_way[0] is sess else await self._read(sid, sess)
                return LogRead(sid, sess, _kept(logged), then)
            case Offload():
                return await self._offload(cmd)
            case _:
                return await self._store(cmd)
        return None

    async def _store(self, cmd: Command) -> Event | None:
        """Carry out a command on the store (and, for an input, the model); its answer."""
        p, store = self.p, self.p.store
        match cmd:
            case ReadCurrent(rec=rec):
                return CurrentIs(rec, await store.current(rec.session_id))  # type: ignore[attr-defined]
            case Claim(rec=rec):
                try:
                    await store.claim(rec.session_id, rec.generation)
                except OwnershipError as exc:
                    return ClaimAnswered(rec, _refusal(exc))
                return ClaimAnswered(rec)
            case LoadState(rec=rec, restore=restore):
                try:
                    if not restore:
                        return Loaded(rec, p.model.init_state(rec.session_id, rec.prompt, session_seed(rec.session_id)))
                    got = await snapshots.restore(store, p.model, p.device, rec.session_id, self.host_cache)
                except ChunkserveError as exc:  # corrupt, vanished, or over max_snapshot_bytes
                    return Loaded(rec, refusal=_refusal(exc))
                return Loaded(rec, got[0], got[1], tuple(got[2])) if got is not None else Loaded(rec, found=False)
            case ReadSession(rec=rec):
                view = await store.session(rec.session_id)
                return SessionRead(rec, view.state if view else None, view.generation if view else None)
            case ApplyInput(sid=sid, held=sess, rec=rec, skipped=skipped, skip_gaps=skip_gaps):
                try:  # fenced first: with the seqs given up on, when there are new ones (Held.skipped_news)
                    await store.set_input_seq(sid, sess.generation, rec.seq,
                                              list(skipped) if skipped is not None else None)
                except OwnershipError as exc:
                    return InputFenced(sid, sess, rec, str(exc))
                p.model.apply_input(sess.state, rec.payload, rec.seq)
                return InputApplied(sid, sess, rec, skip_gaps)
            case EndInStore(rec=rec):
                try:
                    await store.release(rec.session_id, rec.generation, close=isinstance(rec, Terminate))
                except OwnershipError as exc:
                    return EndedInStore(rec, _refusal(exc))
                return EndedInStore(rec)
            case Release(sid=sid, generation=gen, close=close, flush=flush):
                try:
                    if flush:
                        await p.flush()
                    await store.release(sid, gen, close=close)
                except OwnershipError as exc:  # the session is gone from here either way
                    log.info("release of %s refused: %s", sid, exc)
            case Snapshot(sid=sid, held=sess, then=then):
                try:
                    await snapshots.take(store, p.model, sid, sess)
                except LimitError as exc:
                    return SnapshotRefused(sid, sess, then, _refusal(exc), fenced=False)
                except OwnershipError as exc:
                    return SnapshotRefused(sid, sess, then, _refusal(exc), fenced=True)
                return Snapshotted(sid, sess, then)
            case _:
                raise TypeError(f"not a worker command: {cmd!r}")
        return None

    async def _offload(self, cmd: Offload) -> Offloaded:
        """Device -> host -> fenced snapshot in Redis, flush, release; the state kept in host memory."""
        sid, sess = cmd.rec.session_id, cmd.held
        try:
            sess.state.to("cpu")
            manifest = await snapshots.take(self.p.store, self.p.model, sid, sess)
            await self.p.flush()
            await self.p.store.release(sid, sess.generation, close=False)
        except LimitError as exc:  # cannot offload: the session stays resident
            sess.state.to(self.p.device)
            return Offloaded(cmd.rec, sess, _refusal(exc))
        except OwnershipError as exc:
            return Offloaded(cmd.rec, sess, _refusal(exc), fenced=True)
        self.host_cache[sid] = (manifest.snap_id, (sess.state, sess.input_pos, tuple(sorted(sess.skipped))))
        while len(self.host_cache) > self.p.host_cache_sessions:
            self.host_cache.popitem(last=False)
        return Offloaded(cmd.rec, sess)

    async def _read(self, sid: str, sess: Held) -> list[Any] | None:
        """The session's inputs after its last applied one; None when the broker cannot be read."""
        try:
            return await self.p.replay(sid, sess.applied_seq, sess.input_pos if sess.input_pos[0] >= 0 else None)
        except Exception as exc:  # noqa: BLE001 - the broker away
            log.warning("%s: reading %s's inputs from the log failed: %s", self.p.worker_id, sid, exc)
            return None
