"""Dispatch's faust side: the agents that read session events, inputs and worker events and
hand each to the replica's :class:`~.dispatch.DispatchShell` (acking each once its work has
ended), the reader of the control leader's admission plans, and the recovery sweep's timer."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Awaitable, Callable

from schemas.codec import refused_input
from schemas.records import (CommandRejected, Frozen, Heartbeat, InputPushed, Record, SessionClosed, WorkerDown,
                             WorkerUp)
from schemas.topics import misfiled
from streams.topics import misplaced

from ..dispatch import Facts, Seen
from .input_budgets import TRANSIENT, until_done

__all__ = ["WORKER_EVENTS_ACTED_ON", "PLAN_LOOKBACK", "RECOVERY_SWEEP_S", "SWEEP_PAUSE_S", "session_events",
           "session_inputs", "worker_events", "then_ack", "schema_refused", "partitions_of", "tail_plans", "bound",
           "sweeper"]

log = logging.getLogger("processors.agents.dispatch")

# the replica's DispatchShell (``processors.agents.dispatch``, which imports this module), made
# on first use
Shell = Callable[[], Awaitable[Any]]

# the worker events dispatch acts on (``on_worker_event``; heartbeats and starts as signs of
# life of a worker declared down); chunks, claims and accepted inputs pass by undecoded
WORKER_EVENTS_ACTED_ON = frozenset({WorkerDown.TAG, Frozen.TAG, CommandRejected.TAG,
                                    Heartbeat.TAG, WorkerUp.TAG})

# a dispatch replica starting reads scaling-commands from this many records before the end
# (the control leader's latest admission plan is among them)
PLAN_LOOKBACK = 64

# every replica looks at the recovery queue this often (a slot freed is used within it), and
# after a sweep that found the store away, again after this pause
RECOVERY_SWEEP_S = 0.25
SWEEP_PAUSE_S = 2.0


async def session_events(stream: Any, shell: Shell, publisher: Any) -> None:
    from schemas.topics import SESSION_EVENTS
    from streams.faust_app import decode_event

    # acked by hand once its work ends (handled, refused or failed for good), not when the next
    # event is read: an open waiting for room runs on after it, and the offset committed past
    # it lost the open to a killed replica (no verdict, never read again); faust commits up to
    # the first event not acked
    async for event in stream.noack().events():
        rec = await decode_event(event, SESSION_EVENTS, publisher, "dispatch")
        if rec is None:
            event.ack()
            continue
        msg, sh = event.message, await shell()
        misfiled_why = misfiled(rec, msg.key)
        if misfiled_why is not None:
            await sh.dead_letter(publisher, msg, f"refused: {misfiled_why}")
            event.ack()
            continue
        async def handle(work: Any = sh.session_work(rec, f"{msg.partition}:{msg.offset}"), msg: Any = msg,
                         sh: Any = sh,
                         event: Any = event) -> None:
            why = await work()
            if why is not None:  # e.g. an open of a session id that was closed
                await sh.dead_letter(publisher, msg, f"refused: {why}")
            event.ack()

        # a close: the inputs read from now on come after it, from before its submission (which may
        # wait for a place: a review found an input read meanwhile neither before it nor after)
        submission = sh.submit(f"events:{rec.session_id}",  # type: ignore[attr-defined]
                               handle,
                               then_ack(event, lambda exc, msg=msg, sh=sh: sh.dead_letter(
                                   publisher, msg, f"refused: dispatch could not handle it ({exc})")),
                               then_ack(event, lambda why, msg=msg, sh=sh: sh.dead_letter(publisher, msg,
                                                                                          f"refused: {why}")))
        await (sh.closes.submit(rec.session_id, submission) if isinstance(rec, SessionClosed) else submission)


def then_ack(event: Any, refuse: Callable[[Any], Awaitable[Any]]) -> Callable[[Any], Awaitable[None]]:
    """``refuse``, then the event is acked: its verdict is out."""
    async def run(arg: Any) -> None:
        await refuse(arg)
        event.ack()
    return run


async def session_inputs(stream: Any, shell: Shell, publisher: Any) -> None:
    from schemas.topics import SESSION_INPUTS
    from streams.faust_app import decode_event

    async for event in stream.noack().events():  # acked once routed or refused, as session events are
        rec = await decode_event(event, SESSION_INPUTS, publisher, "dispatch")
        msg, sh = event.message, await shell()
        if rec is None:  # dead-lettered for its schema
            sh.rate_windows.passed_over(msg.partition, msg.offset)
            named = schema_refused(msg, publisher.limit(SESSION_INPUTS))
            if named is not None:  # its owner does not wait 5 s for it, as for any input refused
                sh.gate.note_refused(*named)
            event.ack()
            continue
        stamp = msg.timestamp or time.time()  # the record's Kafka timestamp (faust: seconds)
        off = misplaced(msg.key, msg.partition, partitions_of(stream, msg.topic))
        if off is None:  # a rate window is read back on the key's partition only
            await sh.rate_windows.read(rec, msg.key, msg.partition, msg.offset, stamp)  # type: ignore[arg-type]
        refused = sh.admit_input(rec, msg.key, stamp, off)  # type: ignore[arg-type]
        if refused is not None:  # over a bound: refused with the reason, never dropped; the
            # session's next routed input names it, so its owner does not wait for it
            await sh.dead_letter(publisher, msg, f"refused: {refused}")
            event.ack()
            continue

        async def route(rec: InputPushed = rec, msg: Any = msg, sh: Any = sh, event: Any = event) -> None:
            await sh.on_input(rec, msg.partition, msg.offset, msg)
            event.ack()

        await sh.submit(f"inputs:{rec.session_id}",  # type: ignore[attr-defined]
                        route,
                        then_ack(event, lambda exc, rec=rec, msg=msg, sh=sh: sh.refuse_parked(
                            rec, msg, f"dispatch could not route it ({exc})", publisher)),
                        then_ack(event, lambda why, rec=rec, msg=msg, sh=sh: sh.refuse_parked(rec, msg, why, publisher)),
                        sh.closes.waited_for(rec.session_id))  # read after its session's close: after it


def schema_refused(msg: Any, max_bytes: int) -> tuple[str, int] | None:
    """The session and seq an input dead-lettered for its schema names (``schemas.codec.refused_input``)."""
    return refused_input(msg.value, msg.key, max_bytes)


def partitions_of(stream: Any, topic: str) -> int | None:
    """The topic's partition count as the consumer's metadata has it (the group's snapshot,
    else the cluster's; None: not known yet, and the input's partition goes unchecked)."""
    consumer = stream.app.consumer
    try:
        count = consumer.topic_partitions(topic)
        if not count:  # a member that does not lead the group may keep no snapshot
            count = len(consumer._thread._ensure_consumer().partitions_for_topic(topic) or ())
        return count or None
    except Exception:  # noqa: BLE001 - a consumer not started yet
        return None


async def worker_events(stream: Any, shell: Shell, publisher: Any) -> None:
    from schemas.topics import WORKER_EVENTS
    from streams.faust_app import decode_event

    # acked by hand once acted on, as session events are: a Frozen or a refused input handed to
    # a chain was acked when the next event was read, and a replica killed before it acted lost it
    async for event in stream.noack().events():
        rec = await decode_event(event, WORKER_EVENTS, publisher, "dispatch", WORKER_EVENTS_ACTED_ON)
        if rec is None:
            event.ack()
            continue
        sh = await shell()
        if isinstance(rec, (WorkerDown, Heartbeat, WorkerUp)):
            # in the store before the event is acked (tried until the store answers: a death
            # is said once): the sweep does the rest
            await until_done(lambda rec=rec, sh=sh: sh.on_worker_event(rec), sh.name, f"acting on {rec.TAG}")
            event.ack()
            continue

        async def act(rec: Record = rec, sh: Any = sh, event: Any = event) -> None:
            await sh.on_worker_event(rec)
            event.ack()

        key = f"workers:{getattr(rec, 'session_id', '') or rec.worker_id}"  # type: ignore[attr-defined]
        await sh.submit(key, act, then_ack(event, lambda exc, rec=rec, sh=sh: sh.gave_up(rec, exc)))


async def tail_plans(settings: Any, catalogue: Any, shell: Shell) -> None:
    """Every replica reads the control leader's admission plans without a group, from a few
    records before the end (the latest plan) on."""
    from schemas.records import AdmissionPlan
    from schemas.topics import SCALING_COMMANDS
    from streams.kafka import RecordConsumer

    consumer = RecordConsumer(settings, [SCALING_COMMANDS], None, name="dispatch-plans", catalogue=catalogue)
    await consumer.start(subscribe=False)
    try:
        await consumer.assign({SCALING_COMMANDS: None}, -PLAN_LOOKBACK)
        while True:
            for delivered in await consumer.poll(timeout_ms=500):
                if isinstance(delivered.record, AdmissionPlan) and delivered.refused is None:
                    await (await shell()).feed(Seen(delivered.record, Facts(None)))
                elif delivered.refused is not None:
                    log.warning("dispatch: admission plan refused (%s)", delivered.refused)
    finally:
        await consumer.stop()


def bound(agent: Any, shell: Shell, publisher: Any) -> Any:
    async def run(stream: Any) -> None:
        await agent(stream, shell, publisher)

    return run


def sweeper(shell: Shell) -> Callable[[], Awaitable[None]]:
    """The replica's recovery sweep, as its timer runs it: beside the timer, one at a time (one
    waiting on a store away made faust warn every few seconds that its timer overlapped), and
    one that finds the store away says so in one line and pauses (a traceback every 250 ms before)."""
    paused: dict[str, Any] = {"until": -math.inf, "sweep": None}

    async def recovery_sweep() -> None:
        running = paused["sweep"]
        if (running is not None and not running.done()) or time.monotonic() < paused["until"]:
            return
        paused["sweep"] = asyncio.ensure_future(sweep())

    async def sweep() -> None:
        try:
            steps = await (await shell()).sweep()
        except TRANSIENT as exc:
            paused["until"] = time.monotonic() + SWEEP_PAUSE_S
            log.warning("dispatch: recovery sweep: the store is away (%s); again in %.0f s", exc, SWEEP_PAUSE_S)
            return
        except Exception:
            log.exception("dispatch: recovery sweep failed")
            return
        if steps:
            log.info("dispatch: recovery sweep %s", dict(steps))
    return recovery_sweep
