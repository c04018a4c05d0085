"""Dispatch's budgets: its in-flight places (each session's work in order, sessions side by
side), and for inputs before they are routed, the rate rule's count of a window that began
before this process read the partition (read back from the log) and the re-reads of inputs
whose session is not (yet) in the store; and what it remembers, within a bound, of the inputs
it routed and the records it dead-lettered."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections import Counter, OrderedDict
from typing import Any, Awaitable, Callable, Generic, Iterator, TypeVar

from aiokafka.errors import KafkaError

from schemas.errors import InfraError
from schemas.input_rate import rate_counted
from schemas.records import InputPushed

from ..dispatch import Input
from ..input_gate import InputGate

__all__ = ["ClosesRead", "MAX_PARKED", "MAX_PARKED_PER_KEY", "MAX_REREADING", "MAX_REMEMBERED", "STORE_RETRY_S", "TRANSIENT",
           "Chains", "DeadLetterOnce", "RateWindows", "Remembered", "Rereads", "until_done"]

log = logging.getLogger("processors.agents.dispatch")

K = TypeVar("K")
V = TypeVar("V")

# pauses between tries of an event's handling (or a verdict's send) while the store or the
# broker cannot serve it, then RETRY_MAX_S apart until they can
STORE_RETRY_S = (0.2, 0.5, 1.0, 2.0, 4.0)
RETRY_MAX_S = 5.0
# what a try may meet that passes: Redis away (InfraError), the broker away (a send timed out)
TRANSIENT = (InfraError, KafkaError, OSError)

# inputs of unknown sessions read again at once (the rest are refused at once)
MAX_REREADING = 64

# records that arrive behind a session's admission waiting for room wait without an in-flight
# place: this many per session, and this many in all (past either, refused at once)
MAX_PARKED_PER_KEY = 16
MAX_PARKED = 4096

# where the inputs routed last sit in the log, and the records dead-lettered last: this many each
MAX_REMEMBERED = 65_536

# the key of the chain whose work is running in this task (``Chains.waiting_for_room``)
_RUNNING: contextvars.ContextVar[str | None] = contextvars.ContextVar("chain_key", default=None)


class RateWindows:
    """Before the gate counts an input: when its rate window began before this process read
    the partition from where it reads now (a start, a restart, a partition taken over from
    another replica, a consumer put back to an earlier offset), the window's counts start at
    the inputs read back from the log below the offset the reading (re)started from
    (``count_in_window(partition, offset, start_s)``: each session's seqs, in log order), so
    the rule decides as it did, and as a replay does.

    One read back per partition and (re)start, for every session at once: read per session, a
    restart in a busy window opened a consumer and read the window again for each session's
    first input. Read on from there, the windows that follow are counted from the records
    themselves."""

    def __init__(self, gate: InputGate,
                 count_in_window: Callable[[int, int, float], Awaitable[dict[str, list[int]]]] | None,
                 name: str) -> None:
        self.gate, self.count_in_window, self.name = gate, count_in_window, name
        # partition -> (the first timestamp read since the reading last (re)started there, the
        # offset it (re)started from, the offset read last)
        self._reading: dict[int, tuple[float, int, int]] = {}
        # partition -> the (re)start offset and the window read back there (or that could not be)
        self._read_back: dict[int, tuple[int, int]] = {}

    def _since(self, partition: int, offset: int, timestamp_s: float) -> tuple[float, int]:
        """The first timestamp read in ``partition`` since its reading last went back (or
        skipped) to another offset than the next one, and that offset."""
        since, start, last = self._reading.get(partition, (timestamp_s, offset, -2))
        if offset >= 0 and offset != last + 1 and last != -2:  # read again, or from elsewhere
            since, start = timestamp_s, offset
        self._reading[partition] = (since, start, offset if offset >= 0 else last)
        return since, start

    def passed_over(self, partition: int, offset: int) -> None:
        """A record of the partition that is no input (it did not decode): the reading goes on."""
        if partition in self._reading:
            since, start, _ = self._reading[partition]
            self._reading[partition] = (since, start, offset)

    async def read(self, rec: InputPushed, key: bytes | None, partition: int, offset: int, timestamp_s: float) -> None:
        since, start = self._since(partition, offset, timestamp_s)
        counts, sid = self.gate.counts, rec.session_id
        window = counts.window(timestamp_s)
        start_s = counts.start_s(window)
        if (self.count_in_window is None or offset < 0 or start_s >= since or counts.known(sid, window)
                or self._read_back.get(partition) == (start, window)):
            return  # the common case, decided before the payload is measured
        if not rate_counted(rec, key, self.gate.max_bytes):
            return
        self._read_back[partition] = (start, window)
        try:  # below where the reading (re)started: what came after it was counted here
            earlier = await self.count_in_window(partition, start, start_s)
        except Exception as exc:  # noqa: BLE001 - the broker away: count from here, as before a restart
            log.warning("%s: could not read back the rate window of partition %d (%s); counting from here",
                        self.name, partition, exc)
            earlier = {}
        for who, seqs in earlier.items():
            if not counts.known(who, window):  # one counted here meanwhile: its own reading stands
                counts.seed(who, window, seqs)


class Remembered(Generic[K, V]):
    """The latest ``bound`` entries put (the oldest forgotten first): what dispatch keeps of the
    inputs it routed (their place in the log, so a refusal after routing does not read the
    partition to find it) and of the records it dead-lettered (once each, redelivered or not)."""

    def __init__(self, bound: int = MAX_REMEMBERED) -> None:
        self.bound = bound
        self._entries: OrderedDict[K, V] = OrderedDict()

    def put(self, key: K, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)
        while len(self._entries) > self.bound:
            self._entries.popitem(last=False)

    def get(self, key: K) -> V | None:
        return self._entries.get(key)

    def first(self, key: K, value: V) -> bool:
        """Put ``key`` unless it is here already; whether it was not."""
        if key in self._entries:
            return False
        self.put(key, value)
        return True

    def forget(self, key: K) -> None:
        self._entries.pop(key, None)

    def __len__(self) -> int:
        return len(self._entries)


class DeadLetterOnce:
    """What dispatch dead-lettered, by the record's place (topic, partition, offset): a record
    redelivered (a rejoin, a consumer put back) and refused again, maybe for another reason,
    gets no second dead letter. A place not known (None, or below 0) is sent every time."""

    def __init__(self, name: str, bound: int = MAX_REMEMBERED) -> None:
        self.name = name
        self.sent: Remembered[tuple[Any, Any, Any], None] = Remembered(bound)

    async def send(self, place: tuple[Any, Any, Any], send: Callable[[], Awaitable[Any]]) -> None:
        topic, partition, offset = place
        if topic is None or not isinstance(partition, int) or not isinstance(offset, int) or min(partition, offset) < 0:
            await send()
            return
        if not self.sent.first(place, None):
            log.info("%s: %s[%s]@%s was dead-lettered already", self.name, topic, partition, offset)
            return
        try:
            await until_done(send, self.name, "a dead letter")
        except BaseException:
            self.sent.forget(place)  # not sent: the next refusal sends it
            raise


async def until_done(attempt: Callable[[], Awaitable[Any]], name: str, what: str) -> None:
    """``attempt`` tried until it is done while the broker or the store is away (``TRANSIENT``):
    a verdict (a dead letter), or a worker's death marked in the store, so that no record is
    left neither acted on nor refused (faust commits no offset past an event not acked, and a
    record dispatch gave up on was neither: a review found both). Other errors raise; at
    shutdown it is cancelled, and the record is read again at the next start."""
    pauses = iter(STORE_RETRY_S)
    while True:
        try:
            await attempt()
            return
        except TRANSIENT as exc:
            pause = next(pauses, RETRY_MAX_S)
            log.warning("%s: %s failed (%s); again in %.1f s", name, what, exc, pause)
            await asyncio.sleep(pause)


class Rereads:
    """Inputs of sessions not (yet) in the store, read again ``per_input`` times while their
    open may be in flight, within a budget of their own: a flood of made-up ids cannot hold
    every in-flight place for the owner wait (past ``budget`` such an input is refused at
    once). ``now``: the inputs being read again, as (session, seq, partition, offset)."""

    def __init__(self, per_input: int, budget: int) -> None:
        self.per_input, self.budget = per_input, budget
        self.now: set[tuple[str, int, int, int]] = set()

    def allowance(self) -> int:
        return self.per_input if len(self.now) < self.budget else 0

    def take(self, key: tuple[str, int, int, int]) -> int:
        """The re-reads of an input whose session the store does not hold, its place in the
        budget taken at once (given back by :meth:`ended`): taken only once it paused, every
        input read in the meantime saw the budget free (a store that answers later: all of a
        flood of made-up ids were read again, found when the loads' read began to yield)."""
        left = self.allowance()
        if left:
            self.now.add(key)
        return left

    async def pause(self, inp: Input, seconds: float) -> None:
        self.now.add((inp.session_id, inp.seq, inp.partition, inp.offset))
        await asyncio.sleep(seconds)

    @contextlib.contextmanager
    def ended(self, key: tuple[str, int, int, int]) -> Iterator[None]:
        try:
            yield
        finally:
            self.now.discard(key)


class ClosesRead:
    """A close comes after the session's inputs read before it, and only those: one read after
    it is parked until the close's work has ended (it takes no place meanwhile: parked, within
    the bounds of what may wait behind a session), and so reaches the owner after the
    Terminate, which refuses it. (The close waited for every input read until its turn: behind
    an open waiting for room, an input written once the close was acknowledged was routed,
    reached the owner ahead of the Terminate and was applied.)"""

    def __init__(self, chains: Chains) -> None:
        self.chains = chains
        self.pending: dict[str, asyncio.Future[None]] = {}  # session -> its close read last, until its work ends

    def inputs_before(self, sid: str) -> asyncio.Task[Any] | None:
        """As a close is read: the session's last input read before it, for the close to wait for."""
        return self.chains.latest(f"inputs:{sid}")

    async def submit(self, sid: str, submission: Awaitable[asyncio.Task[Any] | None]) -> asyncio.Task[Any] | None:
        """Submit a close of ``sid`` just read (``submission``, not started: ``Chains.submit``,
        which may wait for a place), the inputs read from now on waiting for it; a submission
        that fails or is cancelled holds them no longer than a refused one."""
        submitted, work = self._read(sid), None
        try:
            work = await submission
        finally:
            submitted(work)
        return work

    def _read(self, sid: str) -> Callable[[asyncio.Task[Any] | None], None]:
        """The close read: what to call with its piece once submitted (None: refused for the
        bounds, or the submission failed). The inputs go on once it ends, or at once; a close
        refused while an earlier one is under way holds them until that one ends (a review: a
        refused duplicate let them pass the first)."""
        earlier = self.pending.get(sid)
        ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending[sid] = ended

        def end(_: Any = None) -> None:
            if not ended.done():
                ended.set_result(None)
            if self.pending.get(sid) is ended:
                del self.pending[sid]

        def submitted(work: asyncio.Task[Any] | None) -> None:
            after = work if work is not None else earlier
            if after is None or after.done():
                end()
            else:
                after.add_done_callback(end)
        return submitted

    def waited_for(self, sid: str) -> asyncio.Future[None] | None:
        """As an input is read: the close of its session read before it, while its work has not ended."""
        return self.pending.get(sid)


class Chains:
    """Dispatch's work, at most ``max_in_flight`` pieces at once (the consumer loops wait for
    a place: backpressure on the topics), each key's in the order submitted.

    A piece waiting for room (an open, a return: ``waiting_for_room``) holds its place for up
    to the admission timeout, within dispatch's budget of waiting admissions; what arrives
    behind it under the same key is parked without a place (``MAX_PARKED_PER_KEY`` per key,
    ``MAX_PARKED`` in all; past either it is refused at once with the reason), so a few
    events behind each waiting open cannot hold every place for the timeout."""

    def __init__(self, max_in_flight: int, name: str) -> None:
        self.name = name
        self._places = asyncio.Semaphore(max_in_flight)
        self.tasks: dict[str, asyncio.Task[Any]] = {}  # key -> its latest work
        self.parked: Counter[str] = Counter()  # key -> pieces waiting behind a wait for room or a close
        self.behind_closes = 0  # of them, inputs waiting for their session's close (bounded apart)
        self._waiting: set[str] = set()  # keys whose running piece waits for room

    def waits(self, key: str) -> bool:
        """Whether ``key``'s running piece waits for room (an open, a return)."""
        return key in self._waiting

    def latest(self, key: str) -> asyncio.Task[Any] | None:
        """The piece submitted last under ``key``, while it has not ended: what :meth:`ended`
        waits for, to wait for the work submitted so far and none submitted later."""
        task = self.tasks.get(key)
        return task if task is not None and not task.done() else None

    @staticmethod
    async def ended(task: asyncio.Task[Any] | None, timeout_s: float) -> bool:
        """Wait (at most ``timeout_s``) until ``task`` (from :meth:`latest`) has ended, and with
        it every piece before it under its key; whether it has."""
        if task is None or task.done():
            return True
        done, _ = await asyncio.wait({task}, timeout=timeout_s)
        return bool(done)

    @contextlib.contextmanager
    def waiting_for_room(self) -> Iterator[None]:
        """Called from inside a piece's work while it waits for room (no-op outside a chain)."""
        key = _RUNNING.get()
        if key is None or key in self._waiting:
            yield
            return
        self._waiting.add(key)
        try:
            yield
        finally:
            self._waiting.discard(key)

    def _park(self, key: str, behind_close: bool) -> str | None:
        """Park a piece behind ``key``'s wait for room, or behind its session's close; None, or
        why it cannot be. Each kind has its own bound in all: inputs behind closes could fill
        the one of waits for room, and a close behind its open waiting for room was refused."""
        sid = key.partition(":")[2]
        what = f"the close of {sid} is under way" if behind_close else f"{sid} waits for room"
        if self.parked[key] >= MAX_PARKED_PER_KEY:
            return f"{what}, and {MAX_PARKED_PER_KEY} of its records wait behind it already"
        if (self.behind_closes if behind_close else self.parked.total() - self.behind_closes) >= MAX_PARKED:
            return f"{what}, and {MAX_PARKED} records wait behind such sessions already"
        self.parked[key] += 1
        self.behind_closes += behind_close
        return None

    def _unpark(self, key: str, behind_close: bool) -> None:
        self.parked[key] -= 1
        self.behind_closes -= behind_close
        if self.parked[key] <= 0:
            del self.parked[key]

    async def submit(self, key: str, work: Callable[[], Awaitable[Any]],
                     failed: Callable[[Exception], Awaitable[Any]] | None = None,
                     refused: Callable[[str], Awaitable[Any]] | None = None,
                     after: asyncio.Future[Any] | None = None) -> asyncio.Task[Any] | None:
        """Run ``work`` after every earlier submission under the same key (a session's events,
        or its inputs), concurrently with other keys: one session waiting for capacity does not
        hold up the others, and each session's events (and inputs) keep their order. Returns
        once the work is scheduled. Work the store or the broker could not serve (``TRANSIENT``) is
        tried again until they can (``until_done``); work that fails otherwise (a bug) is handed
        to ``failed`` (an input is refused with the reason: never dropped). Behind a wait for room, a piece
        with a ``refused`` handler is parked (or, past the bounds, handed to it with why), as is
        one that must wait for ``after`` first (an input read after its session's close, which
        held a place while the close waited for room, and a few hundred such inputs took every
        place, the close's too: a review). Returns the piece's task (None: refused)."""
        previous = self.tasks.get(key)
        behind_room = refused is not None and previous is not None and key in self._waiting
        behind_close = refused is not None and not behind_room and after is not None and not after.done()
        parked = behind_room or behind_close
        if parked:
            why = self._park(key, behind_close)
            if why is not None:
                await refused(why)  # type: ignore[misc]
                return None
        else:
            await self._places.acquire()

        async def run() -> None:
            holds, behind = not parked, parked
            try:
                if previous is not None:
                    await asyncio.gather(previous, return_exceptions=True)
                if after is not None:
                    await asyncio.wait({after})
                if parked:  # its turn: a place like any other piece
                    self._unpark(key, behind_close)
                    behind = False
                    await self._places.acquire()
                    holds = True
                _RUNNING.set(key)
                await self._tries(key, work)
            except Exception as exc:
                log.exception("%s: handling %s failed", self.name, key)
                if failed is not None:
                    try:
                        await failed(exc)
                    except Exception:
                        log.exception("%s: reporting the failure of %s failed", self.name, key)
            finally:
                if holds:
                    self._places.release()
                if behind:  # cancelled while parked
                    self._unpark(key, behind_close)
                if self.tasks.get(key) is task:
                    del self.tasks[key]

        task = asyncio.get_running_loop().create_task(run())
        self.tasks[key] = task
        return task

    async def _tries(self, key: str, work: Callable[[], Awaitable[Any]]) -> None:
        # tried until done while the store or the broker is away, holding its place (so the
        # consumers wait: backpressure): given up on after 8 s, an outside run's Redis, down
        # 20 s, had dispatch refuse closes (those sessions ran on for good), opens, and inputs
        # their owners then applied; work tried again is safe (an open committed already, its
        # Assign not sent, finds its generation and sends the Assign)
        await until_done(work, self.name, f"handling {key}")
