"""How the generation store reaches Redis: its Lua scripts loaded once and called by SHA on
one server (async or blocking), or on the namespace's slot master of a Redis Cluster with
replica-acknowledged fenced writes; and the drivers that run the store's sans-IO operations
(``store_ops._Ops``) against a backend."""

from __future__ import annotations

import hashlib
import logging
import re
from importlib import resources
from typing import Any, Generator

from schemas.errors import AccessDeniedError, ConfigError, InfraError

from .config import redis_client

__all__ = ["SCRIPTS", "FENCED_WRITES", "RETRY_WAITS_S"]

Call = tuple[str, list[str], list[Any]]
Op = Generator[Call, Any, Any]


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _load_scripts() -> dict[str, str]:
    folder = resources.files("streams") / "lua"
    fence = (folder / "_fence.lua").read_text()
    out = {}
    for entry in folder.iterdir():
        name = entry.name
        if name.endswith(".lua") and not name.startswith("_"):
            body = entry.read_text()
            out[name[:-4]] = (fence + body) if "fence(" in body else body
    return out


SCRIPTS: dict[str, str] = _load_scripts()


def _redis_errors() -> tuple[type[BaseException], ...]:
    import redis.exceptions as rex

    return rex.ConnectionError, rex.TimeoutError


_SCRIPT_LINE = re.compile(r"@user_script:(\d+)")
_SCRIPT_CALL = re.compile(r"redis\.p?call\(\s*['\"]([A-Za-z]+)")


def refusal(exc: BaseException, user: str | None, operation: str, resource: str,
            source: str | None = None) -> AccessDeniedError | None:
    """Redis' refusal of ``user``, in one line: a wrong password or a disabled user, or an ACL
    without a command or key the store needs (refused inside a script, ``source``'s line it
    names gives the command); None when ``exc`` is something else."""
    import redis.exceptions as rex

    from .config_file import env_var

    said = str(exc).split("\n")[0][:200]
    who = user or "default"
    if isinstance(exc, rex.AuthenticationError) or said.startswith(("WRONGPASS", "NOAUTH")):
        if user is None:  # the server wants a user and password (or its default user is off)
            said = (f"it wants credentials: set {env_var('redis.username')} and {env_var('redis.password')}"
                    f" ({said[:80]})")
        return AccessDeniedError(who, "sign-in", resource, f"{said} (password from {env_var('redis.password')})",
                                 server="Redis", kind="user")
    if isinstance(exc, rex.NoPermissionError) or "NOPERM" in said or "user executing the script can't" in said:
        line = _SCRIPT_LINE.search(said)
        lines = source.splitlines() if source and line else []
        if line and 0 < int(line.group(1)) <= len(lines):
            called = _SCRIPT_CALL.search(lines[int(line.group(1)) - 1])
            if called:
                said = f"the script's {called.group(1).lower()!r} command: {said}"
        return AccessDeniedError(who, operation, resource, f"{said} (streams/acl.py: what the store needs)",
                                 server="Redis", kind="user")
    return None


class _RedisScripts:
    """EVALSHA with one SCRIPT LOAD per script per client, reloading on NOSCRIPT."""

    def __init__(self, client: Any, sources: dict[str, str] | None = None) -> None:
        pool = getattr(client, "connection_pool", None)
        if pool is not None and pool.connection_kwargs.get("decode_responses"):
            raise ConfigError("decode_responses", "the generation store needs decode_responses=False")
        self.client = client
        self.user = pool.connection_kwargs.get("username") if pool is not None else None
        self.sources = sources or SCRIPTS
        self.shas = {n: hashlib.sha1(s.encode()).hexdigest() for n, s in self.sources.items()}
        self.loaded: set[str] = set()


# waits before each retry of a script call that timed out or lost its connection (a process
# resumed after a pause finds its in-flight call timed out); every script is safe to repeat:
# each is a fenced check-and-set that answers a repeat with a refusal or the same result
RETRY_WAITS_S = (0.2, 0.5)


class _AsyncBackend(_RedisScripts):
    async def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        import asyncio

        for wait in (*RETRY_WAITS_S, None):
            try:
                return await self._call(name, keys, args)
            except Exception as exc:  # noqa: BLE001 - a refusal is reported, a lost connection retried
                refused = refusal(exc, self.user, name, f"key {keys[0] if keys else '-'}", self.sources.get(name))
                if refused is not None:
                    raise refused from None
                if not isinstance(exc, _redis_errors()):
                    raise
                if wait is None:
                    raise InfraError(f"generation store: Redis unreachable: {exc}") from exc
                await asyncio.sleep(wait)

    async def _call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        from redis.exceptions import NoScriptError

        if name not in self.loaded:
            await self.client.script_load(self.sources[name])
            self.loaded.add(name)
        try:
            return await self.client.evalsha(self.shas[name], len(keys), *keys, *args)
        except NoScriptError:
            await self.client.script_load(self.sources[name])
            return await self.client.evalsha(self.shas[name], len(keys), *keys, *args)


# scripts that confer or exercise authority: on a replicated store each counts only once a
# replica holds it, so a promoted replica never runs behind an authority someone acted on
# (not the leases: one lost in a failover is taken again at its holder's next refresh, and
# it guards an id against a second process, not a session: generations fence those)
FENCED_WRITES = frozenset({"commit", "claim", "release_chunks", "progress", "snap_commit", "release",
                           "request_close", "set_down", "strand"})


class _ClusterSlotBackend:
    """Script calls on a Redis Cluster: every key of a namespace lives in one slot, so the
    store talks to that slot's master alone, found from ``CLUSTER SLOTS`` and found again
    when it fails over. A fenced write and its ``WAIT`` go down one connection (a pipeline):
    WAIT counts the replicas that hold this connection's writes."""

    def __init__(self, seed_url: str, namespace_key: str, acks: int, ack_timeout_ms: int,
                 client_kwargs: dict[str, Any], sources: dict[str, str] | None = None,
                 failover_s: float = 30.0, seeds: list[tuple[str, int]] | None = None) -> None:
        from urllib.parse import urlsplit

        from redis.crc import key_slot

        seed = urlsplit(seed_url)
        self._seed_url = seed_url
        self._seeds = [(seed.hostname or "127.0.0.1", seed.port or 6379)]
        self._seeds += [node for node in seeds or () if node not in self._seeds]  # redis.seeds: asked after it
        self._slot = key_slot(namespace_key.encode())
        self._namespace_key = namespace_key
        self.acks, self.ack_timeout_ms, self.failover_s = acks, ack_timeout_ms, failover_s
        # what redis-py's from_url takes from the URL: TLS (rediss://) and credentials
        self._kwargs = {**({"ssl": True} if seed.scheme == "rediss" else {}),
                        **({"username": seed.username} if seed.username else {}),
                        **({"password": seed.password} if seed.password else {}), **client_kwargs}
        self._client_kwargs = client_kwargs
        self.user: str | None = self._kwargs.get("username")
        self._reached = False  # a node answered CLUSTER SLOTS
        self.sources = sources or SCRIPTS
        self.shas = {n: hashlib.sha1(src.encode()).hexdigest() for n, src in self.sources.items()}
        self._master: Any = None
        self._last_error = "none tried"
        self._replicas_at, self._replica_count = -1e18, 0
        self.client = None  # nothing for the store to close but the master's client

    def for_key(self, namespace_key: str) -> "_ClusterSlotBackend":
        other = _ClusterSlotBackend(self._seed_url, namespace_key, self.acks, self.ack_timeout_ms,
                                    self._client_kwargs, self.sources, self.failover_s)
        other._seeds, other._reached = list(self._seeds), self._reached
        return other

    async def _find_master(self) -> Any:
        import redis.asyncio

        for host, port in list(self._seeds):
            probe = redis.asyncio.Redis(host=host, port=port, socket_timeout=1.0, **self._kwargs)
            try:
                slots = await probe.execute_command("CLUSTER", "SLOTS")
            except Exception as exc:  # noqa: BLE001 - a refusal is reported, a dead node skipped
                refused = refusal(exc, self.user, "CLUSTER SLOTS", f"the Redis Cluster node {host}:{port}")
                if refused is not None:
                    raise refused from None
                if isinstance(exc, _redis_errors()):
                    self._last_error = f"{host}:{port}: {str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__}"
                    continue
                raise
            finally:
                await probe.aclose()
            self._reached = True
            for start, end, primary, *replicas in slots:
                nodes = [primary, *replicas]
                self._seeds += [(_s(n[0]), int(n[1])) for n in nodes if (_s(n[0]), int(n[1])) not in self._seeds]
                if int(start) <= self._slot <= int(end):
                    return redis_client(host=_s(primary[0]), port=int(primary[1]), **self._kwargs)
        return None

    async def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        import asyncio

        from redis.exceptions import ConnectionError as ConnectionError_
        from redis.exceptions import AskError, ClusterDownError, NoScriptError, ReadOnlyError, ResponseError, TryAgainError

        # the slot moved or is moving: redis-py raises these with the MOVED / ASK / CLUSTERDOWN /
        # READONLY / TRYAGAIN prefix taken off the message, so they are told apart by type
        moving = (AskError, ClusterDownError, ReadOnlyError, TryAgainError)

        # a failover takes a while (and a seed may be down meanwhile); a client that never
        # spoke to a node it reached (TLS on one side only, an untrusted certificate) is
        # reported as soon as the single server's retries would be
        started = asyncio.get_running_loop().time()
        load = False
        while True:
            try:
                if self._master is None:
                    self._master = await self._find_master()
                    if self._master is None:
                        raise ConnectionError_(f"no Redis Cluster node answers ({self._last_error})")
                if load:
                    await self._master.script_load(self.sources[name])
                    load = False
                return await self._run(self._master, name, keys, args)
            except NoScriptError:
                load = True  # a fresh master's (or a promoted replica's) script cache
            except (ResponseError, *_redis_errors()) as exc:
                refused = refusal(exc, self.user, name, f"key {keys[0] if keys else self._namespace_key}",
                                  self.sources.get(name))
                if refused is not None:
                    raise refused from None
                if isinstance(exc, ResponseError) and not isinstance(exc, moving):
                    raise
                budget = sum(RETRY_WAITS_S) + 1.0 if self._misspoken() else self.failover_s
                if asyncio.get_running_loop().time() > started + budget:
                    hint = ""
                    if not self._kwargs.get("ssl") and any(w in str(exc).lower() for w in ("closed by", "reset by")):
                        hint = " (a server that wants TLS drops a plaintext connection: use rediss://)"
                    raise InfraError(f"generation store: the namespace's Redis master is unreachable as user "
                                     f"{self.user or 'default'!r}: {str(exc).splitlines()[0][:200]}{hint}") from exc
                await self._drop_master()
                await asyncio.sleep(0.2)

    def _misspoken(self) -> bool:
        """No node has answered yet, and the last one tried was reached but the connection
        failed in the handshake (not refused or timed out: a node down or paused)."""
        said = self._last_error.lower()
        return not self._reached and any(w in said for w in ("ssl", "reset by peer", "closed by server"))

    async def _drop_master(self) -> None:
        self._replicas_at = -1e18
        if self._master is not None:
            await self._master.aclose()
            self._master = None

    async def _replicas(self, master: Any) -> int:
        """Replicas of this master: the ones the cluster assigns to it and has not marked
        failed (``CLUSTER NODES``), or the ones attached now (``ROLE``) when more; read at
        most once a second. Only they can be promoted past a write; a master left without
        any (its replica was promoted) writes without waiting. A replica cut off from its
        stream but not yet failed still counts: writes wait for it, and are refused until it
        is back or failed."""
        import time

        if time.monotonic() - self._replicas_at > 1.0:
            lines = [ln.split() for ln in _s(await master.execute_command("CLUSTER", "NODES")).splitlines()]
            me = next((p[0] for p in lines if len(p) > 2 and "myself" in p[2]), "")
            assigned = sum(1 for p in lines if len(p) > 3 and "slave" in p[2] and p[3] == me and "fail" not in p[2])
            role = await master.execute_command("ROLE")  # attached now (the cluster's view may lag)
            attached = len(role[2]) if _s(role[0]) == "master" else 0
            self._replica_count = max(assigned, attached)
            self._replicas_at = time.monotonic()
        return self._replica_count

    async def _run(self, master: Any, name: str, keys: list[str], args: list[Any]) -> Any:
        fenced = name in FENCED_WRITES and self.acks > 0
        replicas = await self._replicas(master) if fenced else 0
        need = min(self.acks, replicas)
        if fenced and self.acks > replicas and replicas != getattr(self, "_capped_at", None):  # once per count
            self._capped_at = replicas
            logging.getLogger(__name__).warning(
                "redis.replica_acks is %d, and the namespace's master has %d replica(s) now: a fenced write "
                "waits for %d", self.acks, replicas, need)
        if need == 0:
            return await master.evalsha(self.shas[name], len(keys), *keys, *args)
        pipe = master.pipeline(transaction=False)
        pipe.evalsha(self.shas[name], len(keys), *keys, *args)
        pipe.execute_command("WAIT", need, self.ack_timeout_ms)
        reply, held = await pipe.execute(raise_on_error=False)
        for answer in (reply, held):  # a refusal of either (e.g. an ACL without WAIT) is raised
            if isinstance(answer, Exception):
                raise answer
        if int(held) < need:
            raise InfraError(f"generation store: {name} reached {held} of {need} replicas within "
                             f"{self.ack_timeout_ms} ms (redis.replica_acks); not counted as done")
        return reply

    async def aclose(self) -> None:
        await self._drop_master()


class _SyncBackend(_RedisScripts):
    def call(self, name: str, keys: list[str], args: list[Any]) -> Any:  # type: ignore[override]
        from redis.exceptions import NoScriptError

        try:
            if name not in self.loaded:
                self.client.script_load(self.sources[name])
                self.loaded.add(name)
            try:
                return self.client.evalsha(self.shas[name], len(keys), *keys, *args)
            except NoScriptError:
                self.client.script_load(self.sources[name])
                return self.client.evalsha(self.shas[name], len(keys), *keys, *args)
        except Exception as exc:  # noqa: BLE001 - a refusal is reported in one line
            refused = refusal(exc, self.user, name, f"key {keys[0] if keys else '-'}", self.sources.get(name))
            if refused is not None:
                raise refused from None
            if isinstance(exc, _redis_errors()):
                raise InfraError(f"generation store: Redis unreachable: {exc}") from exc
            raise


def _drive_sync(backend: Any, op: Op) -> Any:
    reply = None
    try:
        while True:
            script, keys, argv = op.send(reply)
            reply = backend.call(script, keys, argv)
    except StopIteration as stop:
        return stop.value


async def _drive_async(backend: Any, op: Op) -> Any:
    reply = None
    try:
        while True:
            script, keys, argv = op.send(reply)
            reply = await backend.call(script, keys, argv)
    except StopIteration as stop:
        return stop.value
