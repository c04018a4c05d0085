"""The dispatch agent: admits sessions by committing generations, routes commands and inputs.

Stateless about sessions: authority lives in the Redis generation store, the load view is a
cache refreshed from it, and any number of replicas may run in one consumer group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Protocol

from schemas.errors import NoCapacityError, OwnershipError, StaleGenerationError
from schemas.records import (Assign, CommandRejected, Generation, InputPushed, PlacementReport,
                             Record, Released, Resume, RoutedInput, SessionActive, SessionClosed,
                             SessionIdle, SessionOpened, Suspend, Terminate, WorkerDown)

from schemas.codec import encode
from schemas.topics import SESSION_INPUTS
from streams.kafka import dead_letter_record

from ..dispatch import Bucket, WorkerLoad, rank_candidates, take

__all__ = ["Publisher", "DispatchShell", "build_app"]

log = logging.getLogger(__name__)


# the worker events dispatch acts on (``on_worker_event``); chunks, heartbeats, claims and
# accepted inputs pass by undecoded
WORKER_EVENTS_ACTED_ON = frozenset({WorkerDown.TAG, Released.TAG, CommandRejected.TAG})


class Publisher(Protocol):
    async def send(self, rec: Record, wait: bool = False) -> Any: ...


class DispatchShell:
    """Turns session events and inputs into generation commits and worker commands."""

    def __init__(self, store: Any, publisher: Publisher, clock: Callable[[], float] = time.time,
                 view_ttl_s: float = 0.25, admission_timeout_s: float = 30.0,
                 owner_wait_s: float = 10.0, name: str = "dispatch",
                 max_in_flight: int = 1024, report_every_s: float = 0.1,
                 max_input_bytes: int = 64 * 1024, input_rate: float = 50.0,
                 input_burst: float = 100.0) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.view_ttl_s = view_ttl_s
        self.admission_timeout_s = admission_timeout_s
        self.owner_wait_s = owner_wait_s
        self.name = name
        self._view: dict[str, WorkerLoad] = {}
        self._view_at = -1e18
        self._chains: dict[str, asyncio.Task[Any]] = {}
        self.max_input_bytes = max_input_bytes
        self.input_rate = input_rate
        self.input_burst = input_burst
        self._buckets: dict[str, Bucket] = {}
        self._reported_at = -1e18
        self.report_every_s = report_every_s
        self._slots = asyncio.Semaphore(max_in_flight)

    async def submit(self, key: str, work: Callable[[], Awaitable[Any]]) -> None:
        """Run ``work`` after every earlier submission under the same key (a session's events,
        or its inputs), concurrently with other keys: one session waiting for capacity does not
        hold up the others, and each session's events (and inputs) keep their order. Returns
        once the work is scheduled."""
        await self._slots.acquire()
        previous = self._chains.get(key)

        async def run() -> None:
            try:
                if previous is not None:
                    await asyncio.gather(previous, return_exceptions=True)
                await work()
            except Exception:
                log.exception("%s: handling %s failed", self.name, key)
            finally:
                self._slots.release()
                if self._chains.get(key) is task:
                    del self._chains[key]

        task = asyncio.get_running_loop().create_task(run())
        self._chains[key] = task

    async def load_view(self, force: bool = False) -> dict[str, WorkerLoad]:
        now = time.monotonic()
        if force or now - self._view_at > self.view_ttl_s:
            raw = await self.store.load_view()
            self._view = {w: WorkerLoad(used=u, capacity=c, draining=d) for w, (u, c, d) in raw.items()}
            self._view_at = now
        return self._view

    async def on_session_event(self, rec: Record) -> None:
        if isinstance(rec, SessionOpened):
            await self.admit(rec.session_id, rec.prompt)
            return
        sid = rec.session_id  # type: ignore[attr-defined]
        view = await self.store.session(sid)
        if view is None or view.state == "closed":
            log.info("%s: %s for session without generation", self.name, rec.TAG)
            return
        gen, ts = view.generation, self.clock()
        if isinstance(rec, SessionClosed):
            if view.state == "suspended":  # nobody holds it: close it in the store directly
                await self.store.release(sid, gen, close=True)
            else:
                await self.publisher.send(Terminate(worker_id=gen.worker_id, session_id=sid,
                                                    generation=gen, ts=ts))
        elif isinstance(rec, SessionIdle) and view.state == "active":
            await self.publisher.send(Suspend(worker_id=gen.worker_id, session_id=sid,
                                              generation=gen, ts=ts))
        elif isinstance(rec, SessionActive):
            if view.state == "suspended":  # back from idle: a new generation, restored
                await self.admit(sid, "", expected_epoch=gen.epoch, restore=True)
            else:
                await self.publisher.send(Resume(worker_id=gen.worker_id, session_id=sid,
                                                 generation=gen, ts=ts))

    async def on_worker_event(self, rec: Record) -> None:
        """Complete migrations (assign the successor), recover a dead worker's sessions and
        re-route inputs a stale owner refused."""
        if isinstance(rec, WorkerDown):
            await self.recover(rec.worker_id)
        elif isinstance(rec, Released) and rec.successor is not None:
            await self.publisher.send(Assign(worker_id=rec.successor.worker_id,
                                             session_id=rec.session_id, generation=rec.successor,
                                             ts=self.clock(), restore=True))
        elif (isinstance(rec, CommandRejected) and rec.command == Resume.TAG
              and rec.generation is not None):
            # the Resume overtook a pending Suspend: the session is offloaded now, bring it back
            view = await self.store.session(rec.session_id)
            if view is not None and view.state == "suspended" and view.generation == rec.generation:
                await self.admit(rec.session_id, "", expected_epoch=view.generation.epoch, restore=True)
        elif isinstance(rec, CommandRejected) and rec.command == RoutedInput.TAG and rec.generation is not None:
            await self.on_input_rejected(rec)

    async def on_input_rejected(self, rec: CommandRejected) -> None:
        """An owner refused an input: route it again when it refused because the session moved
        or is offloaded (and still lives); otherwise, or when that fails, refuse it on
        ``dead-letters`` with the reason. An input is applied or refused, never dropped."""
        view = await self.store.session(rec.session_id)
        if rec.reason in ("stale_epoch", "not_owner") and view is not None and view.state != "closed":
            if await self.route_input(rec.session_id, rec.seq, rec.kind, rec.payload):
                return
            view = await self.store.session(rec.session_id)  # it may have closed meanwhile
        if view is None or view.state == "closed":
            why = f"session closed before input {rec.seq} was applied"
        else:
            why = f"input {rec.seq} refused by its owner"
        raw = encode(InputPushed(session_id=rec.session_id, seq=rec.seq,
                                 kind=rec.kind if rec.kind in ("text", "prompt", "control") else "text",  # type: ignore[arg-type]
                                 payload=rec.payload, ts=rec.ts))
        await self.publisher.send(dead_letter_record(
            SESSION_INPUTS, 0, 0, raw, rec.session_id.encode(),
            f"{why} ({rec.reason} at {rec.worker_id}: {rec.detail})"[:1000], self.name))

    async def recover(self, worker: str) -> int:
        """Source-independent recovery: every session the dead worker still owns gets a new
        generation elsewhere, restored from its last fenced snapshot plus the inputs after it."""
        try:
            await self.store.set_draining(worker, True)  # admit nothing more there
        except OwnershipError:  # deregistered already (a clean shutdown): nothing to recover
            return 0
        self._view_at = -1e18
        recovered = 0
        for sid in await self.store.sessions_of(worker):
            view = await self.store.session(sid)
            if view is None or view.state != "active" or view.generation.worker_id != worker:
                continue
            gen = await self.admit(sid, "", expected_epoch=view.generation.epoch, restore=True,
                                   recover=True, exclude=frozenset({worker}))
            recovered += gen is not None
        log.info("%s: recovered %d sessions of %s", self.name, recovered, worker)
        return recovered

    async def admit(self, session_id: str, prompt: str, expected_epoch: int = 0,
                    restore: bool = False, recover: bool = False,
                    exclude: frozenset[str] = frozenset()) -> Generation | None:
        """Commit the session's next generation on the best worker that admits it."""
        deadline = time.monotonic() + self.admission_timeout_s
        tried: set[str] = set(exclude)
        while True:
            view = await self.load_view(force=bool(tried))
            candidates = rank_candidates(view, frozenset(tried))
            if not candidates:
                if time.monotonic() > deadline:
                    log.error("%s: no worker admitted session %s", self.name, session_id)
                    return None
                tried = set(exclude)
                await asyncio.sleep(0.2)
                self._view_at = -1e18
                continue
            worker = candidates[0]
            try:
                gen = await self.store.commit(session_id, expected_epoch, worker)
            except NoCapacityError:
                tried.add(worker)
                continue
            except StaleGenerationError:
                # redelivered event: the session already has a generation; re-send its Assign
                gen = await self.store.current(session_id)
                if gen is None:
                    return None
            except OwnershipError as exc:
                log.info("%s: session %s not admitted: %s", self.name, session_id, exc)
                return None
            await self.publisher.send(Assign(worker_id=gen.worker_id, session_id=session_id,
                                             generation=gen, ts=self.clock(), prompt=prompt,
                                             restore=restore, recover=recover))
            await self._report(gen.worker_id)
            return gen

    async def _report(self, worker: str) -> None:
        view = self._view
        if worker in view:  # keep the cached view close to the truth between refreshes
            w = view[worker]
            view[worker] = WorkerLoad(w.used + 1, w.capacity, w.draining)
        now = time.monotonic()
        if now - self._reported_at < self.report_every_s:
            return
        self._reported_at = now
        await self.publisher.send(PlacementReport(
            ts=self.clock(), workers=len(view), sessions=sum(w.used for w in view.values()),
            source=self.name, loads={k: v.used for k, v in sorted(view.items())[:256]}))

    def admit_input(self, rec: InputPushed) -> str | None:
        """None if the input may be routed; else why not (payload too large, rate exceeded)."""
        size = len(rec.payload.encode())
        if size > self.max_input_bytes:
            return f"input payload is {size} bytes, over the {self.max_input_bytes}-byte limit"
        bucket, ok = take(self._buckets.get(rec.session_id), time.monotonic(),
                          self.input_rate, self.input_burst)
        self._buckets[rec.session_id] = bucket
        if len(self._buckets) > 100_000:  # forget the oldest sessions' buckets
            for sid in list(self._buckets)[:10_000]:
                del self._buckets[sid]
        if not ok:
            return f"input rate over {self.input_rate:g}/s (burst {self.input_burst:g}) for this session"
        return None

    async def on_input(self, rec: InputPushed, partition: int = -1, offset: int = -1) -> bool:
        """Forward an input to the current owner, stamped with its generation."""
        return await self.route_input(rec.session_id, rec.seq, rec.kind, rec.payload,
                                      partition, offset)

    async def route_input(self, sid: str, seq: int, kind: str, payload: str,
                          partition: int = -1, offset: int = -1) -> bool:
        """Route to the owner; an input for a suspended session wakes it (restored first)."""
        deadline = time.monotonic() + self.owner_wait_s
        view = await self.store.session(sid)
        while view is None and time.monotonic() < deadline:  # the open may still be in flight
            await asyncio.sleep(0.05)
            view = await self.store.session(sid)
        if view is None or view.state == "closed":
            return False
        gen: Generation | None = view.generation
        if view.state == "suspended":
            gen = await self.admit(sid, "", expected_epoch=view.generation.epoch, restore=True)
            if gen is None:
                gen = await self.store.current(sid)
        if gen is None:
            return False
        await self.publisher.send(RoutedInput(worker_id=gen.worker_id, session_id=sid,
                                              generation=gen, seq=seq, kind=kind,  # type: ignore[arg-type]
                                              payload=payload, ts=self.clock(),
                                              source_partition=partition, source_offset=offset))
        return True


def build_app(settings: Any) -> Any:
    """The faust app running the dispatch agents (session events and inputs)."""
    from schemas.topics import SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.generations import GenerationStore
    from streams.topics import TopicCatalogue

    import redis.asyncio  # noqa: F401  (imported now: the first session would wait for it)

    app = make_app("dispatch", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    state: dict[str, DispatchShell] = {}

    async def shell() -> DispatchShell:
        if "shell" not in state:
            store = GenerationStore.from_settings(settings)
            state["shell"] = DispatchShell(store, publisher, max_input_bytes=settings.max_input_bytes,
                                           input_rate=settings.input_rate_per_s,
                                           input_burst=settings.input_burst)
        return state["shell"]

    @app.agent(publisher.topic(SESSION_EVENTS), name="dispatch-session-events")
    async def session_events(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, SESSION_EVENTS, publisher, "dispatch")
            if rec is not None:
                sh = await shell()
                await sh.submit(f"events:{rec.session_id}",  # type: ignore[attr-defined]
                                lambda rec=rec, sh=sh: sh.on_session_event(rec))

    @app.agent(publisher.topic(SESSION_INPUTS), name="dispatch-session-inputs")
    async def session_inputs(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, SESSION_INPUTS, publisher, "dispatch")
            if rec is None:
                continue
            msg = event.message
            sh = await shell()
            refused = sh.admit_input(rec)  # type: ignore[arg-type]
            if refused is not None:  # over a bound: refused with the reason, never dropped
                await publisher.dead_letter(msg, f"refused: {refused}", "dispatch")
                continue

            async def route(rec: Any = rec, msg: Any = msg, sh: DispatchShell = sh) -> None:
                if not await sh.on_input(rec, msg.partition, msg.offset):
                    await publisher.dead_letter(msg, "no owner for session (unknown or closed)", "dispatch")

            await sh.submit(f"inputs:{rec.session_id}", route)  # type: ignore[attr-defined]

    @app.agent(publisher.topic(WORKER_EVENTS), name="dispatch-worker-events")
    async def worker_events(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, WORKER_EVENTS, publisher, "dispatch", WORKER_EVENTS_ACTED_ON)
            if rec is not None:
                sh = await shell()
                key = f"workers:{getattr(rec, 'session_id', '') or rec.worker_id}"  # type: ignore[attr-defined]
                await sh.submit(key, lambda rec=rec, sh=sh: sh.on_worker_event(rec))

    return app
