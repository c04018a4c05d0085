"""The worker's core decides without I/O: each event in, commands out as data, each command's
answer fed back as an event. These tests play the shell by hand (no store, broker or model)."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from schemas.records import (Assign, ChunkDone, Claimed, CommandRejected, Generation, InputAccepted, Released,
                             RoutedInput, Suspend, Terminate)
from workers.core import WorkerCore
from workers.core_types import (OWED, ApplyInput, At, AwaitLog, ChunksReleased, Claim, ClaimAnswered, CurrentIs,
                                EndedInStore, EndInStore, Flush, GapCheck, Got, InputApplied, Loaded, LoadState, LogRead, Offload,
                                Offloaded, OffloadReady, ReadCurrent, ReadLog, ReadSession, SessionRead, Send, Snapshot,
                                Then)

GEN = Generation("w", 3)
AT = At(mono=10.0, wall=1000.0)


@dataclass
class _State:
    input_seq: int = 0
    chunk_index: int = 0


@dataclass(frozen=True)
class _Out:
    chunk_index: int
    input_seq: int = 0
    checksum: str = ""


def _input(seq: int, gen: Generation = GEN) -> RoutedInput:
    return RoutedInput(worker_id="w", session_id="s", generation=gen, seq=seq, kind="text", payload=f"in {seq}",
                       ts=1.0)


def _sent(cmds: list) -> list:
    return [c.rec for c in cmds if isinstance(c, Send)]


def _held(core: WorkerCore, assign: Assign, state: _State) -> list:
    """Play the shell through an Assign's claim and load; the commands after the load."""
    assert core.decide(Got(assign), AT) == [Claim(assign)]
    assert core.decide(ClaimAnswered(assign), AT) == [LoadState(assign, restore=assign.restore)]
    return core.decide(Loaded(assign, state), AT)


def test_an_input_before_its_assign_waits_and_runs_once_the_session_is_claimed() -> None:
    core, state = WorkerCore("w"), _State()
    assert core.decide(Got(_input(1)), AT) == [ReadSession(_input(1))]  # not held: ask the store
    assert core.decide(SessionRead(_input(1), "active", GEN), AT) == []  # its Assign is on its way
    assert core.early.waiting("s") == [1]
    after = _held(core, Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, prompt="p"), state)
    assert [type(r) for r in _sent(after)] == [Claimed]
    [apply] = [c for c in after if isinstance(c, ApplyInput)]
    assert apply.rec.seq == 1 and core.sessions["s"].generation == GEN
    # the shell fenced it and the model applied it (the core keeps its own count, not the model's)
    done = core.decide(InputApplied("s", apply.held, apply.rec, apply.skip_gaps), AT)
    assert [(type(r), r.seq) for r in _sent(done)] == [(InputAccepted, 1)] and apply.held.applied_seq == 1


def test_an_input_the_store_does_not_route_here_is_refused_so_dispatch_routes_it_again() -> None:
    core = WorkerCore("w")
    core.decide(Got(_input(1)), AT)
    [refused] = _sent(core.decide(SessionRead(_input(1), "active", Generation("v", 4)), AT))
    assert isinstance(refused, CommandRejected) and refused.reason == "stale_epoch" and refused.seq == 1


def test_a_refused_input_names_the_record_it_was_routed_so_its_dead_letter_is_that_records() -> None:
    core = WorkerCore("w")
    placed = RoutedInput(worker_id="w", session_id="s", generation=GEN, seq=1, kind="text", payload="in 1", ts=1.0,
                         source_partition=8, source_offset=132)
    core.decide(Got(placed), AT)
    [refused] = _sent(core.decide(SessionRead(placed, "active", Generation("v", 4)), AT))
    assert (refused.source_partition, refused.source_offset) == (8, 132)


def test_an_offload_waits_for_a_recoverys_inputs_and_is_refused_while_they_cannot_be_read() -> None:
    core, state = WorkerCore("w"), _State()
    assign = Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, restore=True, recover=True)
    after = _held(core, assign, state)
    sess = core.sessions["s"]
    assert [c.held for c in after if isinstance(c, ReadLog)] == [sess] and sess.replay_owed
    suspend = Suspend(worker_id="w", session_id="s", generation=GEN, ts=2.0)
    [wait] = core.decide(Got(suspend), AT)
    assert isinstance(wait, AwaitLog) and (wait.held, wait.then) == (sess, suspend)
    [refused] = _sent(core.decide(LogRead("s", sess, None, suspend), AT))  # the broker away
    assert refused.command == Suspend.TAG and refused.detail == OWED and core.sessions["s"] is sess
    again = core.decide(LogRead("s", sess, (), suspend), AT)  # read now: nothing after the snapshot
    assert not sess.replay_owed and [type(c.event) for c in again if isinstance(c, Then)] == [OffloadReady]
    [offload] = core.decide(again[0].event, AT)
    assert isinstance(offload, Offload) and offload.held is sess
    [released] = _sent(core.decide(Offloaded(suspend, sess), AT))
    assert isinstance(released, Released) and released.reason == "suspended" and "s" not in core.sessions


def test_a_recoverys_inputs_are_read_once_at_a_time_and_read_again_after_a_failed_read() -> None:
    core = WorkerCore("w")
    _held(core, Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, restore=True, recover=True), _State())
    sess = core.sessions["s"]

    def reads() -> list:
        return [(c.sid, c.held) for c in core.decide(GapCheck(), AT) if isinstance(c, ReadLog)]

    assert reads() == []  # the recovery's read is on its way: no second one at a heartbeat
    assert core.decide(LogRead("s", sess, None), AT) == [] and sess.replay_owed  # the broker away
    assert reads() == [("s", sess)] and reads() == []  # asked again once, then on its way
    core.decide(LogRead("s", sess, ()), AT)
    assert not sess.replay_owed and reads() == []


def test_a_close_before_its_assign_ends_the_session_in_the_store_and_refuses_its_early_inputs() -> None:
    core = WorkerCore("w")
    core.decide(Got(_input(1)), AT)
    core.decide(SessionRead(_input(1), "active", GEN), AT)
    close = Terminate(worker_id="w", session_id="s", generation=GEN, ts=2.0)
    assert core.decide(Got(close), AT) == [ReadCurrent(close)]
    assert core.decide(CurrentIs(close, GEN), AT) == [EndInStore(close)]
    sent = _sent(core.decide(EndedInStore(close), AT))
    assert [(type(r), getattr(r, "reason", None)) for r in sent] == [(CommandRejected, "closed"),
                                                                    (Released, "closed")]
    assert core.early.waiting("s") == []


def test_a_fenced_chunk_drops_the_session_and_refuses_what_waited() -> None:
    core, state = WorkerCore("w"), _State()
    _held(core, Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, prompt="p"), state)
    core.decide(Got(_input(2)), AT)  # waits for seq 1
    sess = core.sessions["s"]
    cmds = core.decide(ChunksReleased((("s", sess),), (_Out(0),), ((False, "stale_epoch"),), AT.mono, 0.05,
                                      0.1, 16), AT)
    sent = _sent(cmds)
    assert [(type(r), r.reason) for r in sent] == [(CommandRejected, "stale_epoch"), (Released, "fenced")]
    assert sent[0].seq == 2 and "s" not in core.sessions and cmds[-1] == Flush()


def test_released_chunks_are_reported_and_every_nth_is_snapshotted() -> None:
    core, state = WorkerCore("w"), _State(chunk_index=16)
    _held(core, Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, prompt="p"), state)
    sess = core.sessions["s"]
    cmds = core.decide(ChunksReleased((("s", sess),), (_Out(16),), ((True, None),), AT.mono, 0.05, 0.1, 16), AT)
    assert [type(r) for r in _sent(cmds)] == [ChunkDone]
    assert cmds[-2] == Flush() and isinstance(cmds[-1], Snapshot) and cmds[-1].held is sess
    assert sess.released_chunk == 16 and sess.next_due == AT.mono + 0.1


def test_a_restore_that_finds_no_snapshot_starts_the_session_new() -> None:
    """A session that went idle before its first snapshot has none: its restoring Assign
    starts it new (the core decides; the shell only reports there was none)."""
    core = WorkerCore("w")
    assign = Assign(worker_id="w", session_id="s", generation=GEN, ts=1.0, prompt="p", restore=True)
    core.decide(Got(assign), AT)
    assert core.decide(ClaimAnswered(assign), AT) == [LoadState(assign, restore=True)]
    assert core.decide(Loaded(assign, found=False), AT) == [LoadState(assign, restore=False)]
    assert "s" not in core.sessions
    assert [type(r) for r in _sent(core.decide(Loaded(assign, _State()), AT))] == [Claimed]


def test_the_core_touches_no_store_broker_model_or_clock() -> None:
    """What it may import: records, its events and commands, the ownership machine and the
    schedule (no asyncio, redis, kafka, torch, time)."""
    for name in ("core.py", "core_types.py"):
        tree = ast.parse((Path(__file__).resolve().parents[2] / "workers" / name).read_text())
        imported = {node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
        allowed = {"__future__", "dataclasses", "typing", "schemas.records", "core_types", "ownership", "schedule"}
        assert imported <= allowed, (name, imported)
