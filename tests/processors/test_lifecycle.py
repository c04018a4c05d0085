import itertools

from processors.decisions import Offload, Discard
from processors.lifecycle import TRANSITIONS, Action, EventKind, SessionEvent, SessionState, on_event, transition


def test_table_is_total_and_terminated_is_final():
    for state, event in itertools.product([None, *SessionState], EventKind):
        assert (state, event) in TRANSITIONS
    for event in EventKind:
        assert transition(SessionState.TERMINATED, event) == (SessionState.TERMINATED, Action.NONE)


def test_idle_suspends_and_active_resumes():
    s, cmds = on_event(None, SessionEvent(0.0, "a", EventKind.OPEN, 100))
    assert s.lifecycle is SessionState.EXECUTION and s.gpu_id is None and not s.restore and cmds == ()
    from dataclasses import replace

    s = replace(s, gpu_id="g1")
    s, cmds = on_event(s, SessionEvent(1.0, "a", EventKind.IDLE))
    assert s.lifecycle is SessionState.SUSPENDED and s.gpu_id is None and cmds == (Offload("a", "g1"),)
    s, cmds = on_event(s, SessionEvent(2.0, "a", EventKind.ACTIVE))
    assert s.lifecycle is SessionState.EXECUTION and s.restore and cmds == ()
    s, cmds = on_event(s, SessionEvent(3.0, "a", EventKind.CLOSE))
    assert s.lifecycle is SessionState.TERMINATED and cmds == (Discard("a", None),)
    again, cmds = on_event(s, SessionEvent(4.0, "a", EventKind.ACTIVE))
    assert again.lifecycle is SessionState.TERMINATED and cmds == ()


def test_one_state_vocabulary_down_to_the_store_scripts() -> None:
    """The store's states are the lifecycle's, one for one, and the Lua scripts and their
    in-memory twin write no other value of ``st``."""
    import re
    from pathlib import Path

    from processors.lifecycle import STORE_STATE, SessionState
    from streams.generations import StoreState

    assert set(STORE_STATE) == set(SessionState)
    assert sorted(STORE_STATE.values()) == sorted(StoreState)
    root = Path(__file__).resolve().parents[2] / "streams"
    written = set()
    for lua in (root / "lua").glob("*.lua"):  # the values HSET writes (HMGET only names fields)
        for line in lua.read_text().splitlines():
            if "'HSET'" in line:
                written |= set(re.findall(r"'st',\s*'(\w+)'", line))
    twin = (root / "generations_memory.py").read_text()
    written |= set(re.findall(r'st="(\w+)"', twin)) | set(re.findall(r'get\("st"\) [!=]= "(\w+)"', twin))
    assert written == {s.value for s in StoreState}, written
