"""Dispatch when its consumer is put back to an earlier offset (a rejoin after a paused broker
read session-inputs again from its beginning): the rate rule's read-backs stay bounded, a
refusal after routing does not read the partition to find its input, and each refused record
gets one dead letter however often it is delivered."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from processors.agents.dispatch import DispatchShell
from processors.agents.input_budgets import Remembered
from processors.dispatch import Input
from schemas.input_rate import RateCount
from schemas.records import DeadLetter, Generation, InputPushed, Record, RoutedInput
from streams.generations import SessionView, StoreState

TOPIC = "p.session-inputs"


class Sent:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.letters: list[tuple[Any, str]] = []

    async def send(self, rec: Record, wait: bool = False) -> None:
        self.records.append(rec)

    async def dead_letter(self, msg: Any, reason: str, consumer: str) -> None:
        self.letters.append((msg, reason))


def _log(sessions: int = 10, seconds: int = 120) -> list[tuple[int, float, InputPushed]]:
    """One partition: (offset, timestamp, input); session s0 sends 3/s (over the rule), the rest 1/s."""
    out: list[tuple[float, InputPushed]] = []
    for i in range(sessions):
        per_s = 3 if i == 0 else 1
        for k in range(seconds * per_s):
            out.append((k / per_s + i * 0.01, InputPushed(session_id=f"s{i}", seq=k + 1, kind="text", payload="x",
                                                          ts=0.0)))
    out.sort(key=lambda x: x[0])
    return [(offset, 1000.0 + t, rec) for offset, (t, rec) in enumerate(out)]


def test_a_rewound_partition_is_counted_from_the_records_not_read_back_for_each_input():
    log = _log()
    scans: list[int] = []

    async def count_in_window(partition: int, offset: int, start_s: float) -> dict[str, list[int]]:
        scans.append(offset)  # the log read back, as streams.input_log does
        counts = RateCount(1.0, 2.0)
        window = counts.window(start_s)
        out: dict[str, list[int]] = {}
        for o, t, r in log:
            if o < offset and t >= start_s and counts.window(t) == window:
                out.setdefault(r.session_id, []).append(r.seq)
        return out

    shell = DispatchShell(store=None, publisher=None, input_rate=1.0, input_burst=2.0,
                          count_in_window=count_in_window)

    async def read(records: list[tuple[int, float, InputPushed]]) -> list[str | None]:
        verdicts = []
        for offset, t, rec in records:
            await shell.rate_windows.read(rec, rec.session_id.encode(), 0, offset, t)
            verdicts.append(shell.admit_input(rec, rec.session_id.encode(), t))
        return verdicts

    # started 80 s into the log (the topic held inputs from before this process): one read
    # back for the partition (was one per session: ten)
    later = asyncio.run(read(log[1000:]))
    assert scans == [1000]
    rewound = asyncio.run(read(log))  # put back to the beginning (a rejoin reset to earliest)
    # was one read-back per session and window older than the first start: about 400; read
    # from the log's start, whose first window begins there, it needs none
    assert scans == [1000], scans
    assert rewound[1000:] == later  # and the rule decides as it did
    assert sum(v is not None for v in rewound) > 0  # s0 is over the rate


def test_a_record_that_does_not_decode_does_not_restart_the_reading():
    scans: list[int] = []

    async def count_in_window(partition: int, offset: int, start_s: float) -> dict[str, list[int]]:
        scans.append(offset)
        return {}

    shell = DispatchShell(store=None, publisher=None, input_rate=1.0, input_burst=2.0,
                          count_in_window=count_in_window)
    rec = lambda sid: InputPushed(session_id=sid, seq=1, kind="text", payload="x", ts=0.0)  # noqa: E731

    async def go() -> None:
        await shell.rate_windows.read(rec("a"), b"a", 0, 10, 101.0)  # started inside the window 100-102
        shell.rate_windows.passed_over(0, 11)  # dead-lettered as undecodable
        await shell.rate_windows.read(rec("b"), b"b", 0, 12, 104.5)  # window 104-106 was read from its start

    asyncio.run(go())
    assert scans == [10]


def _store() -> Any:
    view = SessionView(Generation("w1", 3), StoreState.ACTIVE, True, 0, 0, None)

    class Store:
        async def session(self, sid: str) -> SessionView:
            return view

        async def load_view(self) -> dict[str, Any]:
            return {"w1": SimpleNamespace(used=1, capacity=4, draining=False, down=False)}

    return Store()


def test_an_input_refused_after_routing_is_dead_lettered_where_it_was_routed_from_without_a_scan():
    reads: list[tuple[str, int]] = []

    async def read_inputs(sid: str, after_seq: int) -> list[Any]:
        reads.append((sid, after_seq))
        return []

    sent = Sent()
    shell = DispatchShell(_store(), sent, read_inputs=read_inputs, inputs_topic=TOPIC)
    assert asyncio.run(shell.route_input("s", 5, "text", "hi", partition=3, offset=77)) is None
    assert [type(r) for r in sent.records] == [RoutedInput]
    # its owner refused it (a worker down, a stale generation): routed again, then refused
    asyncio.run(shell.refuse(Input("s", 5, "text", "hi"), "its session was closed"))
    letter = sent.records[-1]
    assert isinstance(letter, DeadLetter) and (letter.partition, letter.offset) == (3, 77)
    assert reads == []  # no read of the partition from its start for it


def test_a_refused_input_delivered_again_gets_one_dead_letter():
    """A rejoin put the consumer back: the same record comes again and is refused for another
    reason; it was dead-lettered twice (same partition and offset, two reasons)."""
    sent = Sent()
    shell = DispatchShell(store=None, publisher=sent, inputs_topic=TOPIC)
    msg = SimpleNamespace(topic=TOPIC, partition=2, offset=40, key=b"s", value=b"")
    asyncio.run(shell.refuse(Input("s", 4, "text", "hi", partition=2, offset=40, origin=msg), "no owner"))
    asyncio.run(shell.refuse(Input("s", 4, "text", "hi", partition=2, offset=40, origin=msg), "session closed"))
    asyncio.run(shell.dead_letter(sent, msg, "refused: dispatch could not route it"))
    assert [reason for _, reason in sent.letters] == ["refused: no owner"]
    # one refused after routing, delivered again: one dead letter too
    asyncio.run(shell.refuse(Input("t", 1, "text", "hi", partition=2, offset=41), "no owner"))
    asyncio.run(shell.refuse(Input("t", 1, "text", "hi", partition=2, offset=41), "session closed"))
    assert len([r for r in sent.records if isinstance(r, DeadLetter)]) == 1
    # another record, or one whose place is not known, is dead-lettered as before
    asyncio.run(shell.dead_letter(sent, SimpleNamespace(topic=TOPIC, partition=2, offset=42), "refused: x"))
    asyncio.run(shell.dead_letter(sent, "the record", "refused: y"))
    asyncio.run(shell.dead_letter(sent, "the record", "refused: y"))
    assert len(sent.letters) == 4


def test_a_dead_letter_that_could_not_be_sent_is_sent_again_or_on_the_next_refusal(monkeypatch):
    """The broker away: sent again until it is out (once). Any other failure (cancelled at
    shutdown, say): not remembered as sent, so the next refusal of the record sends it."""
    import processors.agents.input_budgets as budgets

    monkeypatch.setattr(budgets, "STORE_RETRY_S", (0.01,))

    class Failing(Sent):
        fails: list[BaseException] = []

        async def dead_letter(self, msg: Any, reason: str, consumer: str) -> None:
            if self.fails:
                raise self.fails.pop(0)
            await super().dead_letter(msg, reason, consumer)

    sent = Failing()
    shell = DispatchShell(store=None, publisher=sent, inputs_topic=TOPIC)
    sent.fails = [ConnectionError("broker away"), ConnectionError("broker away")]
    asyncio.run(shell.dead_letter(sent, SimpleNamespace(topic=TOPIC, partition=0, offset=1), "refused: a"))
    asyncio.run(shell.dead_letter(sent, SimpleNamespace(topic=TOPIC, partition=0, offset=1), "refused: b"))
    assert [reason for _, reason in sent.letters] == ["refused: a"]  # tried until out; once
    msg = SimpleNamespace(topic=TOPIC, partition=0, offset=2)
    sent.fails = [RuntimeError("not the broker")]
    try:
        asyncio.run(shell.dead_letter(sent, msg, "refused: c"))
    except RuntimeError:
        pass
    asyncio.run(shell.dead_letter(sent, msg, "refused: d"))
    assert [reason for _, reason in sent.letters] == ["refused: a", "refused: d"]


def test_what_dispatch_remembers_is_bounded():
    kept: Remembered[int, int] = Remembered(bound=3)
    for i in range(5):
        kept.put(i, i)
    assert len(kept) == 3 and kept.get(0) is None and kept.get(4) == 4
    assert not kept.first(4, 0) and kept.first(9, 0) and kept.get(2) is None
