"""Input bounds at the router: a per-session token bucket and a payload limit."""

from __future__ import annotations

from processors.agents.dispatch import DispatchShell
from processors.input_gate import MAX_REFUSED, InputGate, take
from schemas.records import InputPushed


def test_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket, results = None, []
    for _ in range(5):
        bucket, ok = take(bucket, 0.0, rate=2.0, burst=3.0)
        results.append(ok)
    assert results == [True, True, True, False, False]
    bucket, ok = take(bucket, 0.5, rate=2.0, burst=3.0)  # one token back after 0.5 s
    assert ok and not take(bucket, 0.5, rate=2.0, burst=3.0)[1]
    bucket, _ = take(bucket, 100.0, rate=2.0, burst=3.0)  # never above the burst
    assert bucket.tokens == 2.0


def test_router_refuses_oversized_and_too_frequent_inputs_with_a_reason() -> None:
    shell = DispatchShell(store=None, publisher=None, max_input_bytes=10, input_rate=0.001,
                          input_burst=2)

    def push(seq: int, payload: str) -> str | None:
        return shell.admit_input(InputPushed(session_id="s", seq=seq, kind="text",
                                             payload=payload, ts=0.0), b"s")

    assert push(1, "x" * 11) is not None and "over the 10-byte limit" in push(1, "x" * 11)
    assert push(1, "ok") is None and push(2, "ok") is None
    assert "input rate" in push(3, "ok")
    assert shell.admit_input(InputPushed(session_id="other", seq=1, kind="text", payload="ok",
                                         ts=0.0), b"other") is None  # buckets are per session
    misfiled = InputPushed(session_id="other", seq=2, kind="text", payload="ok", ts=0.0)
    assert "is not the session id" in shell.admit_input(misfiled, b"s")
    assert shell.gate.refused_before("other") == (2,)  # named on the session's next routed input


def test_router_refuses_a_seq_below_one() -> None:
    shell = DispatchShell(store=None, publisher=None)
    why = shell.admit_input(InputPushed(session_id="s", seq=0, kind="text", payload="hi", ts=0.0), b"s")
    assert why is not None and "numbered from 1" in why


def test_the_gate_hands_its_refused_seqs_to_the_next_routed_input_once() -> None:
    gate = InputGate(max_bytes=10, rate=1000.0, burst=1000.0)
    assert gate.refuse("s", 2, 11, 0.0) is not None and gate.refuse("s", 3, 11, 0.0) is not None
    assert gate.refuse("s", 4, 2, 0.0) is None
    gate.note_refused("t", 7)  # refused elsewhere (a misfiled key)
    assert gate.refused_before("s") == (2, 3) and gate.refused_before("s") == ()
    assert gate.refused_before("t") == (7,)
    for seq in range(1, 200):  # bounded per session: the latest kept
        gate.refuse("u", seq, 11, 0.0)
    kept = gate.refused_before("u")
    assert len(kept) == MAX_REFUSED and kept[-1] == 199
