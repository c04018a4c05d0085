"""The dispatch agent: admits sessions by committing generations, routes commands and inputs.

Stateless about sessions: authority lives in the Redis generation store, the load view is a
cache refreshed from it, and any number of replicas may run in one consumer group. The shell
is here; the faust agents that feed it are in ``dispatch_streams``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter, deque
from dataclasses import replace
from typing import Any, Awaitable, Callable, Protocol

from schemas.errors import NoCapacityError, OwnershipError, StaleGenerationError
from schemas.records import (CommandRejected, Frozen, Heartbeat, InputPushed, Record, RoutedInput,
                             SessionClosed, SessionOpened, WorkerDown, WorkerUp)

from schemas.topics import SESSION_INPUTS, misfiled

from ..admission import WorkerLoad
from ..dispatch import (REREAD_S, RETRY_S, Admission, CloseInStore, Command, Commit, Committed,
                        CommitRefused, DispatchView, Move, Moved, MoveRefused, Event, Facts, Input, Note, Publish,
                        ReadAgain, Refuse, RefuseEvent, RequestClose, Retry, RetryLater, RouteAgain, Seen, counted,
                        decide)
from ..input_gate import InputGate
from .dispatch_streams import (RECOVERY_SWEEP_S, bound, session_events, session_inputs, sweeper, tail_plans,
                               worker_events)
from .input_budgets import MAX_REREADING, Chains, ClosesRead, DeadLetterOnce, RateWindows, Remembered, Rereads
from .recovery import Recovery
from .refusals import Refusals

__all__ = ["Publisher", "DispatchShell", "build_app"]

log = logging.getLogger(__name__)


# a close waits at most this long for the session's inputs this replica read before it to be
# routed (longer than a try's pause, RETRY_MAX_S): after a store outage, the close (an event)
# woke before the inputs pushed before it and refused them (an outside run with Redis killed:
# 17-30% of the inputs; waiting 5 s at its first try only, 0.7-1.8%)
CLOSE_WAITS_S = 10.0

class Publisher(Protocol):
    async def send(self, rec: Record, wait: bool = False) -> Any: ...


class DispatchShell(Refusals):
    """Carries out the dispatch core's commands (``processors.dispatch.decide``): reads what
    the store says about each event's session, commits, publishes, dead-letters (its
    :class:`~.refusals.Refusals`), and feeds the outcomes back to the core."""

    def __init__(self, store: Any, publisher: Publisher, clock: Callable[[], float] = time.time,
                 view_ttl_s: float = 0.25, admission_timeout_s: float = 30.0,
                 owner_wait_s: float = 10.0, name: str = "dispatch",
                 max_in_flight: int = 1024, max_input_bytes: int = 64 * 1024,
                 input_rate: float = 50.0, input_burst: float = 100.0,
                 read_inputs: Callable[[str, int], Awaitable[list[Any]]] | None = None,
                 inputs_topic: str = SESSION_INPUTS,
                 count_in_window: Callable[[int, int, float], Awaitable[dict[str, list[int]]]] | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.store, self.publisher, self.clock, self.monotonic = store, publisher, clock, monotonic
        self.view_ttl_s, self.name = view_ttl_s, name
        self.rereads = Rereads(int(owner_wait_s / REREAD_S), MAX_REREADING)
        self.view = DispatchView({}, source=name, admission_retries=int(admission_timeout_s / RETRY_S))
        self.waiting = 0  # admissions for session events waiting for room (the view's max_waiting)
        self._view_at = -1e18
        self._reading: asyncio.Future[None] | None = None  # the read of the loads on its way
        self.gate = InputGate(max_input_bytes, input_rate, input_burst)
        self.chains = Chains(max_in_flight, name)
        # the session's inputs after a seq, read back from the log (LoggedInput); the topic's full name
        self.read_inputs, self.inputs_topic = read_inputs, inputs_topic
        self.rate_windows = RateWindows(self.gate, count_in_window, name)
        # (session, seq) -> (partition, offset) of the inputs routed last; and the records
        # (topic, partition, offset) dead-lettered last: one dead letter each, redelivered or not
        self.places: Remembered[tuple[str, int], tuple[int, int]] = Remembered()
        self.dead_letters = DeadLetterOnce(name)
        self.recovery = Recovery(self)
        self.closes = ClosesRead(self.chains)

    async def submit(self, key: str, work: Callable[[], Awaitable[Any]],
                     failed: Callable[[Exception], Awaitable[Any]] | None = None,
                     refused: Callable[[str], Awaitable[Any]] | None = None,
                     after: asyncio.Future[Any] | None = None) -> asyncio.Task[Any] | None:
        """``work`` in order under ``key``, concurrently with other keys (:class:`Chains`)."""
        return await self.chains.submit(key, work, failed, refused, after)

    # --- the core's inputs ---------------------------------------------------------------

    async def load_view(self, force: bool = False) -> dict[str, WorkerLoad]:
        """The workers' loads, read at most every ``view_ttl_s`` (``force``: now); callers that
        find the view old while a read is on its way wait for that one (500 at once made 500
        reads of the workers' hash before)."""
        now = self.monotonic()
        if force or now - self._view_at > self.view_ttl_s:
            reading = self._reading
            if force or reading is None:  # a forced read starts after what it knows changed
                reading = asyncio.ensure_future(self._read_view(now))
                if not force:
                    self._reading = reading
                    reading.add_done_callback(self._read_done)
            await asyncio.shield(reading)
        return dict(self.view.workers)

    async def _read_view(self, now: float) -> None:
        raw = await self.store.load_view()
        self.view = replace(self.view, read_at=self.monotonic(), workers={
            w: WorkerLoad(used=x.used, capacity=x.capacity, draining=x.draining, down=x.down)
            for w, x in raw.items()})
        self._view_at = now

    def _read_done(self, task: asyncio.Future[None]) -> None:
        if self._reading is task:
            self._reading = None

    def invalidate_view(self) -> None:  # recovery: processors/agents/recovery.py
        self._view_at = -1e18

    async def is_down(self, worker: str) -> bool:
        load = (await self.load_view()).get(worker)
        return load is not None and load.down

    async def facts(self, sid: str) -> Facts:
        sv = await self.store.session(sid)
        return Facts(sv, sv is not None and await self.is_down(sv.generation.worker_id),
                     open_waits=sv is None and self.chains.waits(f"events:{sid}"))

    async def feed(self, event: Event) -> list[str]:
        """Decide on ``event``, carry out the commands and feed their outcomes back, until
        nothing follows; returns the reasons of the inputs refused on the way."""
        refused: list[str] = []
        queue: deque[Event] = deque([event])
        waits = False  # an open or a return of this event waits for room: counted until it ends
        parks = False
        with contextlib.ExitStack() as waiting:
            try:
                while queue:
                    ev = queue.popleft()
                    await self.load_view()
                    self.view, commands = decide(replace(self.view, waiting=self.waiting), ev, self.clock())
                    for cmd in commands:
                        if isinstance(cmd, RetryLater) and cmd.admission.waiting and not waits:
                            waits, self.waiting = True, self.waiting + 1
                            waiting.enter_context(self.chains.waiting_for_room())  # what follows it parks
                        if isinstance(cmd, ReadAgain) and cmd.event.facts.open_waits and not parks:
                            parks = True  # an input waiting with its open: the session's next inputs park
                            waiting.enter_context(self.chains.waiting_for_room())
                        outcome = await self.carry_out(cmd, refused)
                        if outcome is not None:
                            queue.append(outcome)
            finally:
                self.waiting -= waits
        return refused

    async def carry_out(self, cmd: Command, refused: list[str]) -> Event | None:
        match cmd:
            case RouteAgain(record=rec):  # its owner refused it
                await self.publisher.send(replace(rec, refused_before=self.gate.recently_refused(rec.session_id, rec.seq)))
            case Publish(record=rec):
                await self.publisher.send(rec)
                if isinstance(rec, RoutedInput):  # its names are out
                    self.gate.named(rec.session_id, rec.refused_before)
            case Commit(admission=adm, worker=worker):
                return await self.commit(adm, worker)
            case Move(session_id=sid, source=src, target=target):
                try:
                    began = self.monotonic()
                    return Moved(sid, src, await self.store.commit_migration(sid, src, target), began)
                except OwnershipError as exc:
                    return MoveRefused(sid, src, target, exc.reason_code, str(exc))
            case RetryLater(admission=adm, after_s=pause):
                await asyncio.sleep(pause)
                self.invalidate_view()
                return Retry(adm, await self.facts(adm.session_id))
            case ReadAgain(event=Seen(what=Input() as inp, facts=facts), after_s=pause):  # waiting with its
                # open: bounded by the open's wait, not by the budget of unknown sessions' inputs
                await (asyncio.sleep(pause) if facts.open_waits else self.rereads.pause(inp, pause))
                return Seen(inp, await self.facts(inp.session_id))
            case RequestClose(session_id=sid):
                await self.store.request_close(sid)
            case CloseInStore(session_id=sid, generation=gen):
                await self.store.release(sid, gen, close=True)
            case Refuse(input=inp, why=why):
                refused.append(why)
                await self.refuse(inp, why)
            case RefuseEvent(why=why):  # the caller dead-letters the event's own record
                refused.append(why)
            case Note(text=text, error=error):
                log.log(logging.ERROR if error else logging.INFO, "%s: %s", self.name, text)
        return None

    async def commit(self, adm: Admission, worker: str) -> Event:
        try:
            began = self.monotonic()
            opened = {"opened_by": adm.opened_by} if adm.opened_by else {}  # kept by a first commit
            return Committed(adm, await self.store.commit(adm.session_id, adm.expected_epoch, worker, **opened), began)
        except NoCapacityError:
            self.invalidate_view()
            return CommitRefused(adm, worker, "no_capacity")
        except StaleGenerationError:
            return CommitRefused(adm, worker, "stale", await self.facts(adm.session_id))
        except OwnershipError as exc:  # an open of a closed session: is it the one that opened it?
            facts = await self.facts(adm.session_id) if adm.opened_by else Facts(None)
            return CommitRefused(adm, worker, exc.reason_code, facts, detail=str(exc))

    # --- what the agents call --------------------------------------------------------------

    async def on_session_event(self, rec: Record, again: bool = False, place: str = "") -> str | None:
        """Act on a session event; None, or why it is refused (the caller dead-letters it).
        ``again``: a try after one that failed, whose commit may have landed; ``place``: where
        the event sits (``partition:offset``: an open's is kept by the store)."""
        # an open is taken as new: its commit (from epoch 0) is the read, and a session that
        # exists already comes back as a stale refusal with what the store holds; tried again,
        # it reads the store first (its Assign owed: where the fleet was full, it waited for room)
        sid = rec.session_id  # type: ignore[attr-defined]
        new = isinstance(rec, SessionOpened) and not again
        facts = Facts(None) if new else await self.facts(sid)
        refused = await self.feed(Seen(rec, replace(facts, place=place)))
        return refused[0] if refused else None

    def session_work(self, rec: Record, place: str = "") -> Callable[[], Awaitable[str | None]]:
        """The work of one session event, as its chain tries it (:meth:`on_session_event`);
        made as the event is read."""
        tries = 0
        # a close comes after the inputs read before it, and only those (:class:`ClosesRead`)
        before = self.closes.inputs_before(rec.session_id) if isinstance(rec, SessionClosed) else None  # type: ignore[attr-defined]

        async def work() -> str | None:
            nonlocal tries
            tries += 1
            if before is not None:  # at every try (the first may meet the store away, the
                # inputs waiting for it as well)
                await self.chains.ended(before, CLOSE_WAITS_S)
            return await self.on_session_event(rec, again=tries > 1, place=place)
        return work

    async def on_worker_event(self, rec: Record) -> None:
        """Recover a dead worker's sessions (the recovery agent), complete migrations, bring
        back sessions and re-route inputs their owner refused (the core)."""
        if isinstance(rec, WorkerDown):
            await self.recovery.worker_down(rec.worker_id, rec.ts)
        elif isinstance(rec, (Heartbeat, WorkerUp)):
            if isinstance(rec, WorkerUp):  # registered just before: the next admission sees it
                self.invalidate_view()
                if (why := self.gate.other_rule(rec.input_rate_per_s, rec.input_burst)) is not None:
                    log.error("%s: worker %s %s", self.name, rec.worker_id, why)
            await self.recovery.worker_alive(rec.worker_id, rec.ts)
        elif isinstance(rec, Frozen):  # read with the store's view: a move committed before is sent again
            await self.feed(Seen(rec, await self.facts(rec.session_id)))
        elif isinstance(rec, CommandRejected) and rec.generation is not None:
            await self.feed(Seen(rec, await self.facts(rec.session_id)))

    def admit_input(self, rec: InputPushed, key: bytes | None, timestamp_s: float,
                    misplaced_why: str | None = None) -> str | None:
        """None if the input (read under ``key``, with this Kafka timestamp) may be routed;
        else why not: its key, its partition (``misplaced_why``, from ``streams.topics.misplaced``),
        or a bound of the ``InputGate``, which keeps every refused seq for the next routed input."""
        why = misfiled(rec, key) or misplaced_why
        if why is not None:
            self.gate.note_refused(rec.session_id, rec.seq)
            return why
        return self.gate.refuse(rec.session_id, rec.seq, len(rec.payload.encode()), timestamp_s)

    async def on_input(self, rec: InputPushed, partition: int = -1, offset: int = -1,
                       origin: Any = None) -> str | None:
        """Route an input to the current owner (``decide``); None when routed or held for a
        lost owner's successor, else why it was refused (and dead-lettered)."""
        return await self.route_input(rec.session_id, rec.seq, rec.kind, rec.payload,
                                      partition, offset, rec.ts, origin)

    async def route_input(self, sid: str, seq: int, kind: str, payload: str, partition: int = -1,
                          offset: int = -1, ts: float = 0.0, origin: Any = None) -> str | None:
        if partition >= 0:
            self.places.put((sid, seq), (partition, offset))
        key = (sid, seq, partition, offset)
        with self.rereads.ended(key):
            facts = await self.facts(sid)
            unknown = facts.session is None and not facts.open_waits  # read again within the budget
            inp = Input(sid, seq, kind, payload, ts, partition, offset, origin=origin,
                        rereads_left=self.rereads.take(key) if unknown else self.rereads.allowance(),
                        refused_before=self.gate.pending(sid, seq))
            refused = await self.feed(Seen(inp, facts))
        return refused[0] if refused else None

    async def report(self, worker: str, began: float) -> None:
        """Count a slot the recovery filled by a commit sent at ``began`` (``monotonic``;
        -inf: none, the slot was counted before), and report the placement now and then."""
        self.view, commands = counted(self.view, worker, began, self.clock())
        for cmd in commands:
            await self.carry_out(cmd, [])

    @property
    def recovery_queue(self) -> int:
        return self.recovery.queued

    async def sweep(self, limit: int = 64) -> Counter[str]:
        return await self.recovery.sweep(limit)


def build_app(settings: Any) -> Any:
    """The faust app running the dispatch agents (session events, inputs, worker events) and
    the recovery sweep."""
    from schemas.topics import SESSION_EVENTS, SESSION_INPUTS, WORKER_EVENTS
    from streams.faust_app import FaustPublisher, make_app
    from streams.generations import GenerationStore
    from streams.input_log import count_partition_inputs, read_session_inputs
    from streams.topics import TopicCatalogue

    import redis.asyncio  # noqa: F401  (imported now: the first session would wait for it)

    app = make_app("dispatch", settings)
    catalogue = TopicCatalogue.from_settings(settings)
    publisher = FaustPublisher(app, catalogue)
    state: dict[str, DispatchShell] = {}

    async def shell() -> DispatchShell:
        if "shell" not in state:
            async def read_inputs(sid: str, after_seq: int) -> list[Any]:
                return await read_session_inputs(settings, sid, after_seq, name="dispatch-close")

            async def count_in_window(partition: int, offset: int, start_s: float) -> dict[str, list[int]]:
                return await count_partition_inputs(settings, partition, offset, start_s)

            state["shell"] = DispatchShell(GenerationStore.from_settings(settings), publisher,
                                           max_input_bytes=settings.max_input_bytes,
                                           input_rate=settings.input_rate_per_s,
                                           input_burst=settings.input_burst, read_inputs=read_inputs,
                                           inputs_topic=catalogue.name(SESSION_INPUTS),
                                           count_in_window=count_in_window)
        return state["shell"]

    for topic, agent in ((SESSION_EVENTS, session_events), (SESSION_INPUTS, session_inputs),
                         (WORKER_EVENTS, worker_events)):
        app.agent(publisher.topic(topic), name=f"dispatch-{topic}")(bound(agent, shell, publisher))

    @app.task
    async def plans() -> None:
        while True:  # the broker away, the topic not created yet: admissions go on meanwhile
            try:
                await tail_plans(settings, catalogue, shell)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("dispatch: reading admission plans failed (%s); again in 1 s", exc)
                await asyncio.sleep(1.0)

    app.timer(interval=RECOVERY_SWEEP_S)(sweeper(shell))
    return app
