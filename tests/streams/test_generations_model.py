"""The real store (async, real Redis) against a plain dict model (STYLE.md §8)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import hypothesis.strategies as st
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from schemas.errors import NoCapacityError, NotOwnerError, StaleGenerationError, UnknownSessionError
from schemas.records import Generation
from streams.generations import GenerationStore

pytestmark = pytest.mark.integration

SESSIONS = ["a", "b", "c"]
WORKERS = ["w1", "w2", "w3"]
CODES = {"unknown_session": UnknownSessionError, "closed": UnknownSessionError, "stale_epoch": StaleGenerationError,
         "not_owner": NotOwnerError, "no_capacity": NoCapacityError}


class Model:
    """What the store should answer: plain dicts, no atomicity needed (one caller)."""

    def __init__(self) -> None:
        self.workers: dict[str, dict[str, Any]] = {}
        self.slots: dict[str, set[str]] = {}
        self.sess: dict[str, dict[str, Any]] = {}

    def register(self, w: str, cap: int) -> str:
        if cap < len(self.slots.get(w, ())):
            return "no_capacity"
        self.workers.setdefault(w, {"drain": False})["cap"] = cap
        self.slots.setdefault(w, set())
        return "ok"

    def drain(self, w: str, flag: bool) -> str:
        if w not in self.workers:
            return "no_capacity"
        self.workers[w]["drain"] = flag
        return "ok"

    def deregister(self, w: str, force: bool) -> Any:
        if w not in self.workers:
            return []
        if self.slots[w] and not force:
            return "no_capacity"
        del self.workers[w]
        return sorted(self.slots.pop(w))

    def commit(self, sid: str, exp: int, w: str, src: str | None = None) -> Any:
        s = self.sess.get(sid)
        if s and s["st"] == "closed":
            return "closed"
        e = s["e"] if s else 0
        if e == 0 and exp != 0:
            return "unknown_session"
        if exp != e:
            return "stale_epoch"
        prev = s["w"] if s else ""
        if src is not None and src != prev:
            return "not_owner"
        if w not in self.workers or self.workers[w]["drain"]:
            return "no_capacity"
        if sid not in self.slots[w] and len(self.slots[w]) >= self.workers[w]["cap"]:
            return "no_capacity"
        if prev and prev != w:
            self.slots.get(prev, set()).discard(sid)
        self.slots[w].add(sid)
        self.sess.setdefault(sid, {"ci": None}).update(w=w, e=e + 1, st="active")
        return Generation(w, e + 1)

    def fence(self, sid: str, gen: Generation, need_slot: bool = True) -> str:
        s = self.sess.get(sid)
        if s is None:
            return "unknown_session"
        if s["st"] == "closed":
            return "closed"
        if gen.epoch != s["e"]:
            return "stale_epoch"
        if gen.worker_id != s["w"]:
            return "not_owner"
        if need_slot and sid not in self.slots.get(gen.worker_id, ()):
            return "no_capacity"
        return "ok"

    def release(self, sid: str, gen: Generation, close: bool) -> str:
        s = self.sess.get(sid)
        if s and s["st"] == "closed" and (s["w"], s["e"]) == (gen.worker_id, gen.epoch):
            return "ok"
        verdict = self.fence(sid, gen, need_slot=False)
        if verdict == "ok":
            self.slots.get(gen.worker_id, set()).discard(sid)
            s["st"] = "closed" if close else "suspended"
        return verdict

    def current(self, sid: str) -> Generation | None:
        s = self.sess.get(sid)
        return None if s is None or s["st"] == "closed" else Generation(s["w"], s["e"])


class StoreVsModel(RuleBasedStateMachine):
    redis_url = ""

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.ns = f"m{uuid.uuid4().hex[:10]}"
        self.store = GenerationStore.from_url(self.redis_url, self.ns)
        self.model = Model()
        self.max_epoch: dict[str, int] = {}

    def run(self, coro: Any) -> Any:
        """The store's answer as the model writes it: a value, "ok", or a reason code."""
        try:
            out = self.loop.run_until_complete(coro)
            return "ok" if out is None else out
        except UnknownSessionError as exc:
            return "closed" if "closed" in str(exc) else "unknown_session"
        except (StaleGenerationError, NotOwnerError, NoCapacityError) as exc:
            return exc.reason_code

    def teardown(self) -> None:
        self.loop.run_until_complete(self.store.aclose())
        self.loop.close()
        client = redis.Redis.from_url(self.redis_url)
        keys = list(client.scan_iter(match=f"{{{self.ns}}}:*"))
        if keys:
            client.delete(*keys)
        client.close()

    def gen_for(self, sid: str, current: bool, w: str, epoch: int) -> Generation:
        cur = self.model.current(sid)
        return cur if current and cur is not None else Generation(w, epoch)

    @rule(w=st.sampled_from(WORKERS), cap=st.integers(0, 3))
    def register(self, w: str, cap: int) -> None:
        assert self.run(self.store.register_worker(w, cap)) == self.model.register(w, cap)

    @rule(w=st.sampled_from(WORKERS), flag=st.booleans())
    def drain(self, w: str, flag: bool) -> None:
        assert self.run(self.store.set_draining(w, flag)) == self.model.drain(w, flag)

    @rule(w=st.sampled_from(WORKERS), force=st.booleans())
    def deregister(self, w: str, force: bool) -> None:
        assert self.run(self.store.deregister_worker(w, force)) == self.model.deregister(w, force)

    @rule(sid=st.sampled_from(SESSIONS), delta=st.sampled_from([0, 0, 0, -1, 1, None]), w=st.sampled_from(WORKERS))
    def commit(self, sid: str, delta: int | None, w: str) -> None:
        s = self.model.sess.get(sid)
        exp = 0 if delta is None or s is None else max(0, s["e"] + delta)
        got = self.run(self.store.commit(sid, exp, w))
        assert got == self.model.commit(sid, exp, w)
        if isinstance(got, Generation):
            assert got.epoch > self.max_epoch.get(sid, 0)  # epochs only grow
            self.max_epoch[sid] = got.epoch

    @rule(sid=st.sampled_from(SESSIONS), current=st.booleans(), src=st.sampled_from(WORKERS),
          epoch=st.integers(1, 5), dest=st.sampled_from(WORKERS))
    def migrate(self, sid: str, current: bool, src: str, epoch: int, dest: str) -> None:
        source = self.gen_for(sid, current, src, epoch)
        got = self.run(self.store.commit_migration(sid, source, dest))
        assert got == self.model.commit(sid, source.epoch, dest, source.worker_id)

    @rule(sid=st.sampled_from(SESSIONS), current=st.booleans(), w=st.sampled_from(WORKERS), epoch=st.integers(1, 5))
    def claim_and_write(self, sid: str, current: bool, w: str, epoch: int) -> None:
        gen = self.gen_for(sid, current, w, epoch)
        verdict = self.model.fence(sid, gen)
        assert self.run(self.store.claim(sid, gen)) == verdict
        # fenced writes: accepted exactly when the writer holds the current, slotted generation
        assert self.run(self.store.write_progress(sid, gen, chunk_index=epoch)) == verdict
        if verdict == "ok":
            self.model.sess[sid]["ci"] = epoch
        view = self.run(self.store.session(sid))
        if sid in self.model.sess:
            assert view.chunk_index == self.model.sess[sid]["ci"]

    @rule(sid=st.sampled_from(SESSIONS), current=st.booleans(), w=st.sampled_from(WORKERS), epoch=st.integers(1, 5),
          close=st.booleans())
    def release(self, sid: str, current: bool, w: str, epoch: int, close: bool) -> None:
        gen = self.gen_for(sid, current, w, epoch)
        assert self.run(self.store.release(sid, gen, close)) == self.model.release(sid, gen, close)

    @invariant()
    def one_current_generation_per_session(self) -> None:
        for sid in SESSIONS:
            assert self.run(self.store.current(sid)) == (self.model.current(sid) or "ok")

    @invariant()
    def slots_never_exceed_capacity(self) -> None:
        view = self.run(self.store.load_view())
        assert set(view) == set(self.model.workers)
        for w, load in view.items():
            assert load.used == len(self.model.slots[w]) <= load.capacity
            assert load.draining == self.model.workers[w]["drain"]


def test_store_matches_the_model(redis_url: str) -> None:
    StoreVsModel.redis_url = redis_url
    run_state_machine_as_test(
        StoreVsModel,
        settings=settings(max_examples=40, stateful_step_count=40, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow]),
    )
