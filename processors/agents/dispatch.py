"""The dispatch agent: admits sessions by committing generations, routes commands and inputs.

Stateless about sessions: authority lives in the Redis generation store, the load view is a
cache refreshed from it, and any number of replicas may run in one consumer group.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Awaitable, Callable, Protocol

from schemas.errors import NoCapacityError, OwnershipError, StaleGenerationError
from schemas.records import (Assign, CommandRejected, Generation, Heartbeat, InputPushed,
                             PlacementReport, Record, Released, Resume, RoutedInput, SessionActive,
                             SessionClosed, SessionIdle, SessionOpened, Suspend, Terminate,
                             WorkerDown, WorkerUp)

from schemas.codec import encode
from schemas.topics import SESSION_INPUTS
from streams.kafka import dead_letter_record

from ..dispatch import InputGate, WorkerLoad, rank_candidates
from .recovery import Recovery

__all__ = ["Publisher", "DispatchShell", "build_app"]

log = logging.getLogger(__name__)


# the worker events dispatch acts on (``on_worker_event``; heartbeats and starts as signs of
# life of a worker declared down); chunks, claims and accepted inputs pass by undecoded
WORKER_EVENTS_ACTED_ON = frozenset({WorkerDown.TAG, Released.TAG, CommandRejected.TAG,
                                    Heartbeat.TAG, WorkerUp.TAG})


# every replica looks at the recovery queue this often (a slot freed is used within it)
RECOVERY_SWEEP_S = 0.25


class Publisher(Protocol):
    async def send(self, rec: Record, wait: bool = False) -> Any: ...


class DispatchShell:
    """Turns session events and inputs into generation commits and worker commands."""

    def __init__(self, store: Any, publisher: Publisher, clock: Callable[[], float] = time.time,
                 view_ttl_s: float = 0.25, admission_timeout_s: float = 30.0,
                 owner_wait_s: float = 10.0, name: str = "dispatch",
                 max_in_flight: int = 1024, report_every_s: float = 0.1,
                 max_input_bytes: int = 64 * 1024, input_rate: float = 50.0,
                 input_burst: float = 100.0,
                 read_inputs: Callable[[str, int], Awaitable[list[Any]]] | None = None,
                 inputs_topic: str = SESSION_INPUTS) -> None:
        self.store, self.publisher, self.clock = store, publisher, clock
        self.view_ttl_s = view_ttl_s
        self.admission_timeout_s = admission_timeout_s
        self.owner_wait_s = owner_wait_s
        self.name = name
        self._view: dict[str, WorkerLoad] = {}
        self._view_at = -1e18
        self._chains: dict[str, asyncio.Task[Any]] = {}
        self.gate = InputGate(max_input_bytes, input_rate, input_burst)
        self._reported_at = -1e18
        self.report_every_s = report_every_s
        self._slots = asyncio.Semaphore(max_in_flight)
        # the session's inputs after a seq, read back from the log (LoggedInput); the topic's full name
        self.read_inputs, self.inputs_topic = read_inputs, inputs_topic
        self.recovery = Recovery(self)

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
            self._view = {w: WorkerLoad(used=x.used, capacity=x.capacity, draining=x.draining, down=x.down)
                          for w, x in raw.items()}
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
                return
            # a close wins over any move still to come (recovery, migration); a session whose
            # owner is down is released by the recovery sweep, the others by their owner
            await self.store.request_close(sid)
            if view.stranded or await self.is_down(gen.worker_id):
                return
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
            await self.worker_down(rec.worker_id, rec.ts)
        elif isinstance(rec, (Heartbeat, WorkerUp)):
            await self.worker_alive(rec.worker_id, rec.ts)
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
            if await self.route_input(rec.session_id, rec.seq, rec.kind, rec.payload) is None:
                return
            view = await self.store.session(rec.session_id)  # it may have closed meanwhile
        if view is None or view.state == "closed":
            why = f"session closed before input {rec.seq} was applied"
        else:
            why = f"input {rec.seq} refused by its owner"
        await self.refuse_input(rec.session_id, rec.seq, rec.kind, rec.payload, rec.ts,
                                 f"{why} ({rec.reason} at {rec.worker_id}: {rec.detail})")

    async def refuse_input(self, sid: str, seq: int, kind: str, payload: str, ts: float,
                            why: str, partition: int = 0, offset: int = 0) -> None:
        raw = encode(InputPushed(session_id=sid, seq=seq,
                                 kind=kind if kind in ("text", "prompt", "control") else "text",  # type: ignore[arg-type]
                                 payload=payload, ts=ts))
        await self.publisher.send(dead_letter_record(
            self.inputs_topic, partition, offset, raw, sid.encode(), why[:1000], self.name))

    def invalidate_view(self) -> None:  # recovery: processors/agents/recovery.py
        self._view_at = -1e18

    @property
    def recovery_queue(self) -> int:
        return self.recovery.queued

    async def is_down(self, worker: str) -> bool:
        load = (await self.load_view()).get(worker)
        return load is not None and load.down

    async def worker_down(self, worker: str, ts: float) -> int:
        return await self.recovery.worker_down(worker, ts)

    async def worker_alive(self, worker: str, ts: float) -> None:
        await self.recovery.worker_alive(worker, ts)

    async def sweep(self, limit: int = 64) -> Counter[str]:
        return await self.recovery.sweep(limit)

    async def admit(self, session_id: str, prompt: str, expected_epoch: int = 0,
                    restore: bool = False, recover: bool = False,
                    exclude: frozenset[str] = frozenset()) -> Generation | None:
        """Commit the session's next generation on the best worker that admits it."""
        deadline = time.monotonic() + self.admission_timeout_s
        while True:
            try:
                gen = await self.commit_on_best(session_id, expected_epoch, exclude)
                if gen is None:
                    if time.monotonic() > deadline:
                        log.error("%s: no worker admitted session %s", self.name, session_id)
                        return None
                    await asyncio.sleep(0.2)
                    self._view_at = -1e18
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
            await self.report(gen.worker_id)
            return gen

    async def commit_on_best(self, sid: str, expected_epoch: int,
                              exclude: frozenset[str]) -> Generation | None:
        """One pass over the candidates, best first: the generation committed on the first
        that admits it, or None when none has a free slot. Refusals other than capacity raise."""
        tried: set[str] = set(exclude)
        while True:
            view = await self.load_view(force=len(tried) > len(exclude))
            candidates = rank_candidates(view, frozenset(tried))
            if not candidates:
                return None
            try:
                return await self.store.commit(sid, expected_epoch, candidates[0])
            except NoCapacityError:
                tried.add(candidates[0])

    async def report(self, worker: str) -> None:
        view = self._view
        if worker in view:  # keep the cached view close to the truth between refreshes
            w = view[worker]
            view[worker] = WorkerLoad(w.used + 1, w.capacity, w.draining, w.down)
        now = time.monotonic()
        if now - self._reported_at < self.report_every_s:
            return
        self._reported_at = now
        await self.publisher.send(PlacementReport(
            ts=self.clock(), workers=len(view), sessions=sum(w.used for w in view.values()),
            source=self.name, loads={k: v.used for k, v in sorted(view.items())[:256]}))

    def admit_input(self, rec: InputPushed) -> str | None:
        """None if the input may be routed; else why not (``InputGate``)."""
        return self.gate.refuse(rec.session_id, rec.seq, len(rec.payload.encode()), time.monotonic())

    async def on_input(self, rec: InputPushed, partition: int = -1, offset: int = -1) -> str | None:
        """Forward an input to the current owner, stamped with its generation; None when it
        was routed (or held for a lost owner's successor), else why it is refused."""
        return await self.route_input(rec.session_id, rec.seq, rec.kind, rec.payload,
                                      partition, offset, rec.ts)

    async def route_input(self, sid: str, seq: int, kind: str, payload: str,
                          partition: int = -1, offset: int = -1, ts: float = 0.0) -> str | None:
        """Route to the owner; an input for a suspended session wakes it (restored first); one
        for a session whose owner is down is never sent there: the log keeps it for the
        recovery's replay, or for the close's refusal. None when routed or left to recovery,
        else the reason it is refused."""
        deadline = time.monotonic() + self.owner_wait_s
        view = await self.store.session(sid)
        while view is None and time.monotonic() < deadline:  # the open may still be in flight
            await asyncio.sleep(0.05)
            view = await self.store.session(sid)
        if view is None or view.state == "closed":
            return "no owner for session (unknown or closed)"
        gen: Generation | None = view.generation
        if view.state == "suspended":
            gen = await self.admit(sid, "", expected_epoch=view.generation.epoch, restore=True)
            if gen is None:
                gen = await self.store.current(sid)
        elif view.stranded or await self.is_down(view.generation.worker_id):
            # held in the log: the recovery replays it from there, a close refuses it from there
            return None
        if gen is None:
            return "no owner for session (unknown or closed)"
        await self.publisher.send(RoutedInput(worker_id=gen.worker_id, session_id=sid,
                                              generation=gen, seq=seq, kind=kind,  # type: ignore[arg-type]
                                              payload=payload, ts=self.clock(),
                                              source_partition=partition, source_offset=offset))
        return None

def build_app(settings: Any) -> Any:
    """The faust app running the dispatch agents (session events and inputs)."""
    from schemas.topics import SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS
    from streams.faust_app import FaustPublisher, decode_event, make_app
    from streams.generations import GenerationStore
    from streams.input_log import read_session_inputs
    from streams.topics import TopicCatalogue

    import redis.asyncio  # noqa: F401  (imported now: the first session would wait for it)

    app = make_app("dispatch", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    state: dict[str, DispatchShell] = {}

    async def shell() -> DispatchShell:
        if "shell" not in state:
            store = GenerationStore.from_settings(settings)
            async def read_inputs(sid: str, after_seq: int) -> list[Any]:
                return await read_session_inputs(settings, sid, after_seq, name="dispatch-close")

            state["shell"] = DispatchShell(store, publisher, max_input_bytes=settings.max_input_bytes,
                                           input_rate=settings.input_rate_per_s,
                                           input_burst=settings.input_burst, read_inputs=read_inputs,
                                           inputs_topic=catalogue.name(SESSION_INPUTS))
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
                refused = await sh.on_input(rec, msg.partition, msg.offset)
                if refused is not None:
                    await publisher.dead_letter(msg, refused, "dispatch")

            await sh.submit(f"inputs:{rec.session_id}", route)  # type: ignore[attr-defined]

    @app.agent(publisher.topic(WORKER_EVENTS), name="dispatch-worker-events")
    async def worker_events(stream: Any) -> None:
        async for event in stream.events():
            rec = await decode_event(event, WORKER_EVENTS, publisher, "dispatch", WORKER_EVENTS_ACTED_ON)
            if rec is None:
                continue
            sh = await shell()
            if isinstance(rec, (WorkerDown, Heartbeat, WorkerUp)):
                # in the store before the event is marked read: the sweep does the rest
                await sh.on_worker_event(rec)
            else:
                key = f"workers:{getattr(rec, 'session_id', '') or rec.worker_id}"  # type: ignore[attr-defined]
                await sh.submit(key, lambda rec=rec, sh=sh: sh.on_worker_event(rec))

    @app.timer(interval=RECOVERY_SWEEP_S)
    async def recovery_sweep() -> None:
        try:
            steps = await (await shell()).sweep()
        except Exception:  # Redis away for a moment: the next sweep tries again
            log.exception("dispatch: recovery sweep failed")
            return
        if steps:
            log.info("dispatch: recovery sweep %s", dict(steps))

    return app
