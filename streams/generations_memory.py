"""A pure-Python twin of the generation store, for simulation and model tests.

``MemoryScripts`` re-implements each Lua script of ``streams/lua`` line for line over a dict
keyspace (hashes and sets, values as str/bytes like Redis keeps them), and the stores below run
the very same operations (``store_ops._Ops``) against it, so answers match the Redis store's
(tests/streams/test_generations_equivalence.py holds them to it). One process, no I/O.
Expiry is recorded, not timed: ``ttl`` holds the milliseconds a script set on a key (as
PEXPIRE would), and the key stays until ``expire`` is called for it.
"""

from __future__ import annotations

from typing import Any, Callable

from streams.generations import GenerationStore, SyncGenerationStore
from streams.store_ops import DEFAULT_PART_SIZE, DEFAULT_RETENTION_S

__all__ = ["Keyspace", "MemoryScripts", "MemoryGenerationStore", "SyncMemoryGenerationStore"]

Reply = Any


def _arg(v: Any) -> Any:
    return v if isinstance(v, bytes) else str(v)


class Keyspace:
    """Redis's data structures over ``self.data`` (key -> dict for a hash, set for a set, str
    for a string), with its semantics: empty containers vanish, with their expiry."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {}
        self.ttl: dict[str, int] = {}  # key -> the expiry set on it (ms), as PEXPIRE
        self.calls = 0

    def expire(self, key: str) -> None:
        """The time set on ``key`` has passed: it goes, as Redis expires it."""
        if key in self.ttl:
            self._del(key)

    def _del(self, key: str) -> None:
        self.data.pop(key, None)
        self.ttl.pop(key, None)

    def _h(self, key: str) -> dict[str, Any]:
        return self.data.get(key) or {}

    def _hset(self, key: str, **fields: Any) -> None:
        self.data.setdefault(key, {}).update(fields)

    def _hdel(self, key: str, *fields: str) -> None:
        h = self.data.get(key)
        if h is not None:
            for f in fields:
                h.pop(f, None)
            if not h:
                self._del(key)

    def _hincr(self, key: str, field: str, by: int) -> None:
        h = self.data.setdefault(key, {})
        h[field] = str(int(h.get(field, "0")) + by)

    def _srem(self, key: str, member: str) -> bool:
        s = self.data.get(key)
        if s is None or member not in s:
            return False
        s.discard(member)
        if not s:
            self._del(key)
        return True

    def _sismember(self, key: str, member: str) -> bool:
        return member in (self.data.get(key) or ())


class _Leases(Keyspace):
    """The scripts of the namespace's own records: leases and the log it serves."""

    def _acquire_lease(self, k: list[str], a: list[Any]) -> Reply:
        holder = self.data.get(k[0])
        if holder is None or holder == a[0]:
            self.data[k[0]], self.ttl[k[0]] = a[0], int(a[1])
            return ["refreshed" if holder else "acquired", a[0], a[1]]
        return ["held", holder, str(self.ttl.get(k[0], -1))]

    def _bind_log(self, k: list[str], a: list[Any]) -> Reply:
        cur = self._h(k[0]).get(str(a[0]))
        now = int(a[1])
        if cur is None:
            if int(a[2]) and not int(a[3]) and not self._h(k[1]):
                return ["unknown", "0"]
        elif now < int(cur):
            return ["behind", cur]
        if cur is None or now > int(cur):
            self._hset(k[0], **{str(a[0]): str(now)})
        return ["ok", cur or "0"]

    def _release_lease(self, k: list[str], a: list[Any]) -> Reply:
        if self.data.get(k[0]) == a[0]:
            self._del(k[0])
            return ["ok", "1"]
        return ["ok", "0"]


class MemoryScripts(_Leases):
    """The scripts over the keyspace; a script runs atomically."""

    def call(self, name: str, keys: list[str], args: list[Any]) -> Reply:
        self.calls += 1
        script: Callable[[list[str], list[Any]], Reply] = getattr(self, "_" + name)
        return script(keys, [_arg(a) for a in args])

    def _fence(self, skey: str, slot_key: str, sid: str, worker: str, epoch: int, need_slot: bool) -> Reply:
        cur = self._h(skey)
        if "e" not in cur:
            return ["err", "unknown_session", sid]
        if cur.get("st") == "closed":
            return ["err", "closed", sid]
        e = int(cur["e"])
        if epoch != e:
            return ["err", "stale_epoch", sid, str(epoch), str(e)]
        if worker != cur["w"]:
            return ["err", "not_owner", sid, worker, cur["w"]]
        if need_slot and not self._sismember(slot_key, sid):
            return ["err", "no_capacity", worker,
                    f"session {sid}: generation {e} holds no slot (released or deregistered)"]
        return None

    # -- the scripts, one per streams/lua/<name>.lua --

    def _register_worker(self, k: list[str], a: list[Any]) -> Reply:
        w, cap = a[0], int(a[1])
        h = self._h(k[0])
        used = int(h.get("u:" + w, "0"))
        if cap < used:
            return ["err", "no_capacity", w, f"capacity {cap} below {used} slots in use"]
        if "c:" + w not in h:
            self._hset(k[0], **{"d:" + w: "0", "u:" + w: "0"})
        self._hset(k[0], **{"c:" + w: str(cap)})
        return ["ok"]

    def _set_draining(self, k: list[str], a: list[Any]) -> Reply:
        if "c:" + a[0] not in self._h(k[0]):
            return ["err", "no_capacity", a[0], "not registered"]
        self._hset(k[0], **{"d:" + a[0]: a[1]})
        return ["ok"]

    def _deregister_worker(self, k: list[str], a: list[Any]) -> Reply:
        w = a[0]
        if "c:" + w not in self._h(k[0]):
            return ["ok"]
        held = sorted(self.data.get(k[1]) or ())
        if held and a[1] != "1":
            return ["err", "no_capacity", w, f"deregister refused: {len(held)} sessions hold slots (drain or force)"]
        self._del(k[1])
        self._hdel(k[0], "c:" + w, "d:" + w, "u:" + w, "x:" + w)
        return ["ok", *held]

    def _forget_worker(self, k: list[str], a: list[Any]) -> Reply:
        w = a[0]
        since = self._h(k[0]).get("x:" + w)
        if since is None or float(since) > float(a[1]) or self.data.get(k[1]):
            return ["ok", "0"]
        self._hdel(k[0], "c:" + w, "d:" + w, "u:" + w, "x:" + w)
        return ["ok", "1"]

    def _set_down(self, k: list[str], a: list[Any]) -> Reply:
        h = self._h(k[0])
        if "c:" + a[0] not in h:
            return ["ok", "0"]
        if float(a[1]) > float(h.get("x:" + a[0], "0")):
            self._hset(k[0], **{"x:" + a[0]: a[1]})
        return ["ok", "1"]

    def _set_up(self, k: list[str], a: list[Any]) -> Reply:
        since = self._h(k[0]).get("x:" + a[0])
        if since is not None and float(a[1]) > float(since):
            self._hdel(k[0], "x:" + a[0])
            return ["ok", "1"]
        return ["ok", "0"]

    def _strand(self, k: list[str], a: list[Any]) -> Reply:
        worker, now, n = a[0], float(a[1]), 0
        for key, sid in zip(k[1:], a[2:]):
            cur = self._h(key)
            if cur.get("w") == worker and cur.get("st") == "active" and cur.get("rv") != cur.get("e"):
                self._hset(key, rv=cur["e"])
                self.data.setdefault(k[0], {})[sid] = now
                n += 1
        return ["ok", str(n)]

    def _recovery_due(self, k: list[str], a: list[Any]) -> Reply:
        queue = self.data.get(k[0]) or {}
        due = sorted((score, sid) for sid, score in queue.items() if score <= float(a[0]))[:int(a[1])]
        return [str(len(queue))] + [x for score, sid in due for x in (sid, repr(score))]

    def _recovery_mark(self, k: list[str], a: list[Any]) -> Reply:
        queue = self.data.get(k[0])
        if queue is None or a[0] not in queue or (a[2] != "" and queue[a[0]] != float(a[2])):
            return ["ok", "0"]
        if a[1] == "":
            del queue[a[0]]
            if not queue:
                self._del(k[0])
        else:
            queue[a[0]] = float(a[1])
        return ["ok", "1"]

    def _recovery_take(self, k: list[str], a: list[Any]) -> Reply:
        queue = self.data.get(k[0]) or {}
        if a[0] not in queue or queue[a[0]] > float(a[1]):
            return ["ok", "0"]
        queue[a[0]] = float(a[2])
        return ["ok", "1"]

    def _request_close(self, k: list[str], a: list[Any]) -> Reply:
        cur = self._h(k[0])
        if "e" not in cur:
            return ["err", "unknown_session", a[0]]
        if cur.get("st") != "closed":
            self._hset(k[0], cr="1")
        return ["ok"]

    def _load_view(self, k: list[str], a: list[Any]) -> Reply:
        return [x for kv in self._h(k[0]).items() for x in kv]

    def _commit(self, k: list[str], a: list[Any]) -> Reply:
        sid, exp, target, src, guess, opened_by = a[0], int(a[1]), a[2], a[3], a[4], (a[5] if len(a) > 5 else "")
        cur = self._h(k[0])
        if cur.get("st") == "closed" or cur.get("cr") == "1":
            return ["err", "closed", sid]
        e = int(cur.get("e", "0"))
        if e == 0 and exp != 0:
            return ["err", "unknown_session", sid]
        if exp != e:
            return ["err", "stale_epoch", sid, str(exp), str(e)]
        prev = cur.get("w", "")
        if src != "" and src != prev:
            return ["err", "not_owner", sid, src, prev]
        if prev != guess:
            return ["retry", prev]
        wh = self._h(k[1])
        cap = wh.get("c:" + target)
        if cap is None:
            return ["err", "no_capacity", target, "not registered"]
        if wh.get("d:" + target) == "1":
            return ["err", "no_capacity", target, "draining"]
        if "x:" + target in wh:
            return ["err", "no_capacity", target, "declared down"]
        used = int(wh.get("u:" + target, "0"))
        already = self._sismember(k[2], sid)
        if not already and used >= int(cap):
            return ["err", "no_capacity", target, f"no free slot ({used}/{cap} used)"]
        if prev != "" and prev != target and self._srem(k[3], sid):
            self._hincr(k[1], "u:" + prev, -1)
        if not already:
            self.data.setdefault(k[2], set()).add(sid)
            self._hincr(k[1], "u:" + target, 1)
        self._hset(k[0], w=target, e=str(e + 1), st="active", cl="0")
        if e == 0 and opened_by:
            self._hset(k[0], op=opened_by)
        return ["ok", target, str(e + 1)]

    def _claim(self, k: list[str], a: list[Any]) -> Reply:
        bad = self._fence(k[0], k[1], a[0], a[1], int(a[2]), True)
        if bad:
            return bad
        self._hset(k[0], cl="1")
        return ["ok"]

    def _release_chunks(self, k: list[str], a: list[Any]) -> Reply:
        out = []
        for i in range(len(k) // 2):
            skey = k[2 * i]
            bad = self._fence(skey, k[2 * i + 1], a[4 * i], a[4 * i + 1], int(a[4 * i + 2]), True)
            if bad:
                out.append(bad[1])
                continue
            ci, stored = int(a[4 * i + 3]), int(self._h(skey).get("ci", "-1"))
            epoch = str(a[4 * i + 2])
            if ci < stored or (ci == stored and self._h(skey).get("ce") != epoch):
                out.append("released")
            else:
                self._hset(skey, ci=str(ci), ce=epoch)
                out.append("ok")
        return out

    def _release(self, k: list[str], a: list[Any]) -> Reply:
        sid, w, epoch, close = a[0], a[1], int(a[2]), a[3] == "1"
        cur = self._h(k[0])
        if cur.get("st") == "closed" and cur.get("w") == w and int(cur["e"]) == epoch:
            return ["ok"]
        bad = self._fence(k[0], k[2], sid, w, epoch, False)
        if bad:
            return bad
        if self._srem(k[2], sid):
            self._hincr(k[1], "u:" + w, -1)
        if close:
            self._hset(k[0], st="closed")
            self._hdel(k[0], "sn_id", "sn_n", "sn_size", "sn_sha", "sn_e", "sn_ci", "sn_sq")
            self._del(k[3])
            self.ttl[k[0]] = int(a[4])
        else:
            self._hset(k[0], st="suspended")
        return ["ok"]

    def _progress(self, k: list[str], a: list[Any]) -> Reply:
        bad = self._fence(k[0], k[1], a[0], a[1], int(a[2]), True)
        if bad:
            return bad
        if a[3] != "":
            self._hset(k[0], ci=a[3], ce=str(a[2]))
        if a[4] != "":
            self._hset(k[0], sq=a[4])
        if a[5] != "":
            self._hset(k[0], sk=a[5])
        return ["ok"]

    def _snap_part(self, k: list[str], a: list[Any]) -> Reply:
        bad = self._fence(k[0], k[1], a[0], a[1], int(a[2]), True)
        if bad:
            return bad
        self._hset(k[2], **{a[3]: a[4]})
        return ["ok"]

    def _snap_commit(self, k: list[str], a: list[Any]) -> Reply:
        bad = self._fence(k[0], k[1], a[0], a[1], int(a[2]), True)
        if bad:
            return bad
        sid, snap_id, n = a[0], a[3], int(a[4])
        parts = self._h(k[2])
        for i in range(n):
            if f"{snap_id}:{i}" not in parts:
                return ["err", "missing_part", sid, snap_id, str(i)]
        self._hdel(k[2], *[f for f in list(parts) if not f.startswith(snap_id + ":")])
        self._hset(k[0], sn_id=snap_id, sn_n=a[4], sn_size=a[5], sn_sha=a[6], sn_e=a[2], sn_ci=a[7], sn_sq=a[8])
        return ["ok"]

    def _session(self, k: list[str], a: list[Any]) -> Reply:
        return [x for kv in self._h(k[0]).items() for x in kv]

    def _snap_read(self, k: list[str], a: list[Any]) -> Reply:
        return self._h(k[0]).get(a[0])

    def _sessions_of(self, k: list[str], a: list[Any]) -> Reply:
        return sorted(self.data.get(k[0]) or ())


class _AsyncScripts:
    def __init__(self, scripts: MemoryScripts) -> None:
        self.scripts = scripts

    async def call(self, name: str, keys: list[str], args: list[Any]) -> Reply:
        return self.scripts.call(name, keys, args)


class MemoryGenerationStore(GenerationStore):
    """``GenerationStore``'s async API over ``MemoryScripts`` (never suspends)."""

    def __init__(self, namespace: str = "mem", *, part_size: int = DEFAULT_PART_SIZE,
                 scripts: MemoryScripts | None = None, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.scripts = scripts if scripts is not None else MemoryScripts()
        super().__init__(None, namespace, part_size=part_size, backend=_AsyncScripts(self.scripts),
                         retention_s=retention_s)


class SyncMemoryGenerationStore(SyncGenerationStore):
    """``SyncGenerationStore``'s API over ``MemoryScripts``: the fast path for simulations."""

    def __init__(self, namespace: str = "mem", *, part_size: int = DEFAULT_PART_SIZE,
                 scripts: MemoryScripts | None = None, retention_s: float = DEFAULT_RETENTION_S) -> None:
        self.scripts = scripts if scripts is not None else MemoryScripts()
        super().__init__(None, namespace, part_size=part_size, backend=self.scripts, retention_s=retention_s)
