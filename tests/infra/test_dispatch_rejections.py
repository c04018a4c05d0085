"""What dispatch does with an input its owner refused, against the real generation store.

An input is applied or refused on ``dead-letters`` with a reason, never dropped: an owner's
refusal is routed again while the session lives (offloaded: it is restored first), and
dead-lettered when the session closed meanwhile or the owner refused it for another reason.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from processors.agents.dispatch import DispatchShell
from schemas.codec import decode
from schemas.records import Assign, CommandRejected, DeadLetter, Generation, RoutedInput
from streams.generations import GenerationStore

pytestmark = pytest.mark.integration


class Recorded:
    """The shell's publisher: keeps what it would have published."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def send(self, rec: Any, wait: bool = False) -> None:
        self.sent.append(rec)


def _refusal(gen: Generation, reason: str) -> CommandRejected:
    return CommandRejected(worker_id=gen.worker_id, session_id="s", command=RoutedInput.TAG,
                           reason=reason, ts=0.0, generation=gen, seq=3, detail="test",
                           kind="text", payload="steer")


def _run(redis_url: str, namespace: str, scenario: Any) -> list[Any]:
    async def go() -> list[Any]:
        client = aioredis.from_url(redis_url)
        store = GenerationStore(client, namespace=namespace)
        out = Recorded()
        try:
            for w in ("w0", "w1"):
                await store.register_worker(w, 4)
            await scenario(store, DispatchShell(store, out, admission_timeout_s=2.0))
        finally:
            await store.aclose()
        return out.sent

    return asyncio.run(go())


def test_refused_input_of_a_closed_session_is_dead_lettered(redis_url, namespace):
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        gen = await store.commit("s", 0, "w0")
        await store.release("s", gen, close=True)
        await shell.on_worker_event(_refusal(gen, "not_owner"))

    sent = _run(redis_url, namespace, scenario)
    assert [type(x) for x in sent] == [DeadLetter]
    assert "session closed before input 3 was applied" in sent[0].reason
    pushed = decode("session-inputs", sent[0].raw)  # the input itself, to replay or inspect
    assert (pushed.session_id, pushed.seq, pushed.payload) == ("s", 3, "steer")


def test_refused_input_of_an_offloaded_session_restores_it_and_routes_again(redis_url, namespace):
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        gen = await store.commit("s", 0, "w0")
        await store.claim("s", gen)
        await store.release("s", gen)  # offloaded (suspended): nobody holds it
        await shell.on_worker_event(_refusal(gen, "not_owner"))

    sent = _run(redis_url, namespace, scenario)
    assert [type(x) for x in sent if not x.TAG.startswith("metric.")] == [Assign, RoutedInput]
    assign, routed = [x for x in sent if not x.TAG.startswith("metric.")]
    assert assign.restore and assign.generation.epoch == 2
    assert routed.generation == assign.generation and routed.seq == 3


def test_input_refused_for_another_reason_is_dead_lettered_with_it(redis_url, namespace):
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        gen = await store.commit("s", 0, "w0")
        await store.claim("s", gen)
        await shell.on_worker_event(_refusal(gen, "too_many_pending"))

    sent = _run(redis_url, namespace, scenario)
    assert [type(x) for x in sent] == [DeadLetter]
    assert "input 3 refused by its owner (too_many_pending at w0" in sent[0].reason


def test_session_closing_while_its_refused_input_waits_for_a_worker_dead_letters_it(redis_url, namespace):
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        gen = await store.commit("s", 0, "w0")
        await store.claim("s", gen)
        await store.release("s", gen)  # offloaded
        for w in ("w0", "w1"):  # no worker admits it back for now
            await store.set_draining(w, True)

        async def user_leaves() -> None:
            await asyncio.sleep(0.5)
            await store.release("s", gen, close=True)  # what dispatch does on SessionClosed

        await asyncio.gather(shell.on_worker_event(_refusal(gen, "not_owner")), user_leaves())

    sent = _run(redis_url, namespace, scenario)
    assert [type(x) for x in sent] == [DeadLetter]
    assert "session closed before input 3 was applied" in sent[0].reason


def test_an_input_routed_again_keeps_its_place_in_the_log(redis_url, namespace):
    """Seq 3 twice in the log (a restarted producer's records at offsets 132 and 140): 132 went
    to the old owner, which refused it (the session had moved), and was routed again; the new
    owner refused it as late. Its dead letter is its own record's, not the place dispatch kept
    for seq 3 (140, the other record's): the input routed again carries its place, which the new
    owner's refusal names (before, it carried none and the dead letter named offset 140)."""
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        old = await store.commit("s", 0, "w0")
        await store.claim("s", old)
        await store.release("s", old)  # offloaded, then restored on w1
        new = await store.commit("s", old.epoch, "w1")
        await store.claim("s", new)
        assert await shell.route_input("s", 3, "text", "restarted client B", partition=8, offset=140) is None
        await shell.on_worker_event(CommandRejected(
            worker_id="w0", session_id="s", command=RoutedInput.TAG, reason="stale_epoch", ts=0.0, generation=old,
            seq=3, detail="moved", kind="text", payload="restarted client A", source_partition=8, source_offset=132))
        again = shell.publisher.sent[-1]
        assert isinstance(again, RoutedInput) and again.generation == new
        await shell.on_worker_event(CommandRejected(
            worker_id="w1", session_id="s", command=RoutedInput.TAG, reason="late", ts=0.0, generation=new,
            seq=3, detail="late", kind="text", payload=again.payload, source_partition=again.source_partition,
            source_offset=again.source_offset))

    sent = [x for x in _run(redis_url, namespace, scenario) if not x.TAG.startswith("metric.")]
    routed = [(r.worker_id, r.payload, r.source_partition, r.source_offset) for r in sent if isinstance(r, RoutedInput)]
    assert routed == [("w1", "restarted client B", 8, 140), ("w1", "restarted client A", 8, 132)]
    (letter,) = [d for d in sent if isinstance(d, DeadLetter)]
    assert (letter.partition, letter.offset, decode("session-inputs", letter.raw).payload) == (
        8, 132, "restarted client A")


def test_an_owners_refusal_is_dead_lettered_at_the_inputs_place_in_the_log(redis_url, namespace):
    """The refusal carries no log position: dispatch looks the input up in the session's
    partition (the shell's input-log reader) and names where it sits, never a made-up 0@0."""
    from schemas.records import InputPushed
    from streams.input_log import LoggedInput

    logged = [LoggedInput(5, 40, InputPushed(session_id="s", seq=2, kind="text", payload="a", ts=0.0)),
              LoggedInput(5, 41, InputPushed(session_id="s", seq=3, kind="text", payload="steer", ts=0.0))]

    def scenario_with(log: list[LoggedInput]) -> Any:
        async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
            async def read_inputs(sid: str, after_seq: int) -> list[LoggedInput]:
                return [g for g in log if g.record.session_id == sid and g.record.seq > after_seq]

            shell.read_inputs = read_inputs
            gen = await store.commit("s", 0, "w0")
            await store.claim("s", gen)
            await shell.on_worker_event(_refusal(gen, "too_many_pending"))
        return scenario

    (found,) = _run(redis_url, namespace, scenario_with(logged))
    assert (found.partition, found.offset) == (5, 41)
    (missing,) = _run(redis_url, f"{namespace}b", scenario_with(logged[:1]))
    assert "its place in the log was not found" in missing.reason


def test_an_open_of_a_closed_session_id_is_refused_with_the_reason(redis_url, namespace):
    """A producer reusing a session id the store still keeps closed is told so (the agent
    dead-letters the open with this reason), not left waiting for a claim that never comes."""
    said: list = []

    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        from schemas.records import SessionActive, SessionOpened

        gen = await store.commit("s", 0, "w0")
        await store.release("s", gen, close=True)
        said.append(await shell.on_session_event(SessionOpened(session_id="s", ts=1.0)))
        said.append(await shell.on_session_event(SessionActive(session_id="s", ts=1.0)))
        said.append(await shell.on_session_event(SessionOpened(session_id="fresh", ts=1.0)))

    sent = _run(redis_url, namespace, scenario)
    assert [x is not None and "session s was closed" in x for x in said] == [True, True, False]
    assert [type(x) for x in sent if not x.TAG.startswith("metric.")] == [Assign]  # only the fresh one


def test_an_open_that_finds_no_room_within_the_timeout_is_refused_and_its_id_again_at_once(redis_url, namespace):
    """Every worker full (the store's own slot count): the open waits the admission timeout
    (2 s here), is refused with the reason (its caller dead-letters it) and leaves nothing in
    the store; the same id again within the timeout is refused at once; once a slot frees, a
    new open is admitted."""
    from schemas.records import SessionOpened

    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        for i in range(8):  # both workers' 4 slots taken
            await store.commit(f"busy-{i}", 0, f"w{i % 2}")
        opened = SessionOpened(session_id="s", ts=0.0, prompt="")
        start = asyncio.get_running_loop().time()
        why = await shell.on_session_event(opened)
        waited = asyncio.get_running_loop().time() - start
        assert why == "no worker had room for session s within 2 s" and 1.8 < waited < 6.0
        assert await store.session("s") is None
        start = asyncio.get_running_loop().time()
        why = await shell.on_session_event(opened)
        assert why == "no worker has room for session s (its admission gave up 0 s ago)"
        assert asyncio.get_running_loop().time() - start < 1.0
        busy = await store.session("busy-0")
        await store.release("busy-0", busy.generation, close=True)
        shell.invalidate_view()
        assert await shell.on_session_event(SessionOpened(session_id="t", ts=0.0, prompt="")) is None
        assert (await store.session("t")).generation.worker_id == "w0"

    sent = _run(redis_url, namespace, scenario)
    assert [r.session_id for r in sent if isinstance(r, Assign)] == ["t"]


def test_two_records_of_one_seq_refused_by_their_owner_get_a_dead_letter_each(redis_url, namespace):
    """A restarted producer sent seq 3 twice more (offsets 132 and 133) after it was applied;
    the owner refused both as late. Each gets its own dead letter, with its own bytes and place
    (before, the place dispatch kept per seq was the second's, so the first's dead letter named
    the second's offset and the second, at a place dead-lettered already, got none)."""
    async def scenario(store: GenerationStore, shell: DispatchShell) -> None:
        gen = await store.commit("s", 0, "w0")
        await store.claim("s", gen)
        for offset, payload in ((132, "restarted client A"), (133, "restarted client B")):
            await shell.on_worker_event(CommandRejected(
                worker_id="w0", session_id="s", command=RoutedInput.TAG, reason="late", ts=0.0, generation=gen,
                seq=3, detail="late", kind="text", payload=payload, source_partition=8, source_offset=offset))

    sent = _run(redis_url, namespace, scenario)
    assert [type(x) for x in sent] == [DeadLetter, DeadLetter]
    assert [(d.partition, d.offset, decode("session-inputs", d.raw).payload) for d in sent] == [
        (8, 132, "restarted client A"), (8, 133, "restarted client B")]
    assert all("input 3 refused by its owner (late" in d.reason for d in sent)
