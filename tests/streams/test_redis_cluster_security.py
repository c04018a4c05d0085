"""The generation store on a Redis Cluster that serves TLS only, under the ACL user of
``streams/acl.py``: three masters with a replica each (``tls-port``, ``tls-cluster yes``,
``tls-replication yes``, a test CA's certificate), the ``default`` user off, chunkserve's
password from the environment only. Its fenced writes run and are acknowledged by a replica
over TLS; a wrong password, a plaintext client, another CA, and users whose ACL lacks the
namespace's keys or a command the store runs are each refused, reported in one line naming
the user; the namespace's master fails over and the store follows it, still over TLS."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import redis
from typer.testing import CliRunner

from infra.cli import app
from infra.redis_cluster import ClusterSecurity, EmbeddedRedisCluster
from schemas.errors import AccessDeniedError, ConfigError, InfraError, StaleGenerationError
from schemas.records import Generation
from streams.acl import acl_rules
from streams.config import Settings
from streams.config_file import settings_from_env
from streams.generations import GenerationStore, Keys
from streams.preflight import check
from tests.tls import Pki, make_pki

pytestmark = pytest.mark.integration

NS = "sec"  # the namespace the users' ACLs are written for
PASSWORD = uuid.uuid4().hex  # chunkserve's: reaches the store through CHUNKSERVE_REDIS_PASSWORD only


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _without(rules: list[str], command: str) -> list[str]:
    assert f"+{command}" in rules
    return [r for r in rules if r != f"+{command}"]


class Secured:
    def __init__(self, cluster: EmbeddedRedisCluster, pki: Pki) -> None:
        self.cluster, self.pki = cluster, pki

    def env(self, user: str | None = "chunkserve", password: str | None = PASSWORD, *,
            url: str | None = None, ca: Path | None = None) -> dict[str, str]:
        env = {"CHUNKSERVE_REDIS_URL": url or self.cluster.url, "CHUNKSERVE_REDIS_CLUSTER": "on",
               "CHUNKSERVE_REDIS_SSL_CA_CERTS": str(ca or self.pki.ca), "CHUNKSERVE_NAMESPACE": NS}
        if user is not None:
            env["CHUNKSERVE_REDIS_USERNAME"] = user
        if password is not None:
            env["CHUNKSERVE_REDIS_PASSWORD"] = password
        return env

    def settings(self, *args: Any, **kwargs: Any) -> Settings:
        return settings_from_env(self.env(*args, **kwargs))

    def admin(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(self.pki.ca),
                           username="admin", password=self.cluster.security.admin_password)  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    folder = tmp_path_factory.mktemp("redis-tls")
    pki = make_pki(folder / "pki")
    rules = acl_rules(NS, cluster=True)
    users = {"chunkserve": (PASSWORD, rules),
             "other-ns": (PASSWORD, acl_rules("elsewhere", cluster=True)),  # another namespace's keys
             "no-hset": (PASSWORD, _without(rules, "hset")),  # a command the store's scripts run
             "no-wait": (PASSWORD, _without(rules, "wait"))}  # the fenced writes' acknowledgement
    security = ClusterSecurity(cert=pki.cert, key=pki.key, ca=pki.ca, admin_password=uuid.uuid4().hex,
                               users=users)
    with EmbeddedRedisCluster(folder / "cluster", node_timeout_ms=3000, security=security) as cluster:
        yield Secured(cluster, pki)


def test_the_nodes_serve_tls_only_and_the_default_user_is_off(secured: Secured) -> None:
    port = secured.cluster.ports[0]
    plain = redis.Redis(host="127.0.0.1", port=port, socket_timeout=3)
    with pytest.raises(redis.exceptions.ConnectionError):
        plain.ping()
    anonymous = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(secured.pki.ca))
    with pytest.raises(redis.exceptions.AuthenticationError):
        anonymous.ping()  # NOAUTH: the default user is off
    admin = secured.admin(port)
    config = {_text(k): _text(v) for k, v in admin.config_get("*").items()}
    assert (config["port"], config["tls-port"]) == ("0", str(port))  # no plaintext listener
    assert (config["tls-cluster"], config["tls-replication"]) == ("yes", "yes")
    for client in (plain, anonymous, admin):
        client.close()


def test_fenced_writes_run_under_the_acl_user_and_a_replica_acknowledges_them(secured: Secured) -> None:
    settings = secured.settings()
    assert settings.redis.password == PASSWORD and "chunkserve" == settings.redis.username
    master = secured.cluster.master_of(Keys(NS).workers)
    (replica,) = secured.cluster.replicas_of(master)

    async def run() -> None:
        store = GenerationStore.from_settings(settings)
        assert store._backend.acks == 1  # every fenced write below waits for the replica (WAIT, over TLS)
        try:
            await store.register_worker("w1", 2)
            gen = await store.commit("s1", 0, "w1")
            await store.claim("s1", gen)
            assert await store.release_chunks([("s1", gen, 0)]) == [(True, "ok")]
            await store.put_snapshot("s1", gen, b"state" * 100, chunk_index=0, input_seq=0)
            got = await store.read_snapshot("s1")
            assert got is not None and got[1] == b"state" * 100
            with pytest.raises(StaleGenerationError):
                await store.commit("s1", 0, "w1")  # the fence holds under the ACL user
            await store.release("s1", gen, close=True)
            assert await store.current("s1") is None and gen == Generation("w1", 1)
        finally:
            await store.aclose()

    asyncio.run(run())
    # the writes reached the replica through TLS replication
    on_replica = secured.admin(replica)
    on_replica.execute_command("READONLY")
    assert on_replica.hget(Keys(NS).workers, "c:w1") == b"2"  # w1's capacity
    on_replica.close()
    # and the user may do nothing else: not another namespace's keys, not FLUSHALL, KEYS, CONFIG
    limited = redis.Redis(host="127.0.0.1", port=master, ssl=True, ssl_ca_certs=str(secured.pki.ca),
                          username="chunkserve", password=PASSWORD)
    for refused in (lambda: limited.get("{elsewhere}:x"), limited.flushall, lambda: limited.keys("*"),
                    lambda: limited.config_get("*")):
        with pytest.raises(redis.exceptions.NoPermissionError):
            refused()
    limited.close()


def _refused(settings: Settings, exc_type: type[Exception] = AccessDeniedError) -> tuple[str, float]:
    async def run() -> None:
        store = GenerationStore.from_settings(settings)
        try:
            await store.register_worker("w1", 2)
            await store.commit("s2", 0, "w1")
        finally:
            await store.aclose()

    started = time.monotonic()
    with pytest.raises(exc_type) as refused:
        asyncio.run(run())
    line = str(refused.value)
    assert "\n" not in line and PASSWORD not in line, line
    return line, time.monotonic() - started


def test_a_wrong_password_a_plaintext_client_or_another_ca_is_refused_in_one_line(secured: Secured) -> None:
    line, took = _refused(secured.settings(password="not-it"))
    assert line.startswith("Redis refused user 'chunkserve' sign-in on the Redis Cluster node 127.0.0.1:"), line
    assert "CHUNKSERVE_REDIS_PASSWORD" in line and "not-it" not in line and took < 15, (line, took)  # not the failover's 30 s
    line, _ = _refused(secured.settings(user=None, password=None))  # the default user is off
    assert line.startswith("Redis refused user 'default' sign-in"), line
    assert "it wants credentials: set CHUNKSERVE_REDIS_USERNAME and CHUNKSERVE_REDIS_PASSWORD" in line, line
    plaintext = secured.cluster.url.replace("rediss://", "redis://")
    with pytest.raises(ConfigError, match=r"redis.ssl_ca_certs: set, but redis.url is not a rediss:// URL"):
        secured.settings(url=plaintext)  # a CA with a plaintext URL is a setting's error, not TLS
    env = {k: v for k, v in secured.env(url=plaintext).items() if k != "CHUNKSERVE_REDIS_SSL_CA_CERTS"}
    line, took = _refused(settings_from_env(env), InfraError)  # a client without TLS
    assert "as user 'chunkserve'" in line and "use rediss://" in line and took < 15, (line, took)
    line, took = _refused(secured.settings(ca=secured.pki.other_ca), InfraError)
    assert "CERTIFICATE_VERIFY_FAILED" in line and took < 15, (line, took)


@pytest.mark.parametrize("user, lacks", [
    ("other-ns", "one of the keys"),  # its keys are another namespace's
    ("no-hset", "'hset' command"),    # refused inside the store's script
    ("no-wait", "'wait' command"),    # refused the fenced write's acknowledgement
])
def test_a_user_whose_acl_lacks_what_the_store_needs_is_refused_in_one_line(secured: Secured, user: str,
                                                                             lacks: str) -> None:
    line, _ = _refused(secured.settings(user=user))
    assert line.startswith(f"Redis refused user {user!r} "), line
    assert lacks in line and "streams/acl.py" in line, line


def test_the_start_up_check_and_the_command_line_name_the_user(secured: Secured, kafka_bootstrap: str) -> None:
    for user, password, said in [("chunkserve", "not-it", "refused the credentials of user 'chunkserve'"),
                                 ("other-ns", PASSWORD, "Redis refused user 'other-ns'")]:
        with pytest.raises(ConfigError) as exc:
            asyncio.run(check(secured.settings(user=user, password=password), {}, kafka=False, timeout_s=5))
        assert said in str(exc.value) and "redis.username" in str(exc.value), str(exc.value)
    asyncio.run(check(secured.settings(), {}, kafka=False, timeout_s=5))  # the right user passes

    env = {**os.environ, **secured.env(password="not-it"), "CHUNKSERVE_KAFKA_BOOTSTRAP": kafka_bootstrap,
           "COLUMNS": "400"}
    done = subprocess.run([sys.executable, "-m", "infra", "topics"], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    out = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(out) == 1 and not done.stdout.strip() and "refused the credentials of user 'chunkserve'" in out[0], out
    assert "env CHUNKSERVE_REDIS_USERNAME: redis.username:" in out[0], out
    assert "not-it" not in done.stdout + done.stderr and "Traceback" not in done.stderr


def test_the_printed_acl_command_defines_a_user_the_store_runs_as(secured: Secured) -> None:
    """``chunkserve acls --redis`` prints the user's command; run on every node (ACL users
    are per node), the store runs as that user; docs/security.md shows the same command."""
    env = {"CHUNKSERVE_NAMESPACE": NS, "CHUNKSERVE_REDIS_CLUSTER": "on", "CHUNKSERVE_REDIS_USERNAME": "printed"}
    words = CliRunner().invoke(app, ["acls", "--redis"], env=env).output.split()
    assert words[:5] == ["ACL", "SETUSER", "printed", "on", ">PASSWORD"], words
    assert words[5:] == acl_rules(NS, cluster=True)
    password = uuid.uuid4().hex
    for port in secured.cluster.live_ports():
        admin = secured.admin(port)
        assert admin.execute_command(*words[:4], f">{password}", *words[5:]) in (b"OK", "OK", True)
        admin.close()

    async def run() -> None:
        store = GenerationStore.from_settings(secured.settings(user="printed", password=password))
        try:
            await store.register_worker("wp", 1)
            gen = await store.commit("sp", 0, "wp")
            await store.claim("sp", gen)
            await store.release("sp", gen, close=True)
        finally:
            await store.aclose()

    asyncio.run(run())
    default = CliRunner().invoke(app, ["acls", "--redis"], env={"CHUNKSERVE_NAMESPACE": "cs",
                                                                "CHUNKSERVE_REDIS_CLUSTER": "on",
                                                                "CHUNKSERVE_REDIS_USERNAME": "chunkserve"}).output
    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    assert " ".join(default.split()) in " ".join(doc.split())


def test_a_failover_under_tls_keeps_the_generation_and_the_store_follows(secured: Secured) -> None:
    cluster = secured.cluster
    ns_key = Keys(NS).workers

    async def first() -> Generation:
        store = GenerationStore.from_settings(secured.settings())
        try:
            await store.register_worker("wf", 4)
            view = await store.session("sf")
            return await store.commit("sf", view.generation.epoch if view else 0, "wf")
        finally:
            await store.aclose()

    gen = asyncio.run(first())
    master = cluster.master_of(ns_key)
    (replica,) = cluster.replicas_of(master)
    cluster.kill(master)
    killed = time.monotonic()

    async def after() -> tuple[Generation | None, float, Generation]:
        store = GenerationStore.from_settings(secured.settings())
        try:
            current = await store.current("sf")  # waits for the promotion, following the new master
            back = time.monotonic() - killed
            with pytest.raises(StaleGenerationError):
                await store.commit("sf", gen.epoch - 1, "wf")
            return current, back, await store.commit("sf", gen.epoch, "wf")
        finally:
            await store.aclose()

    current, back, moved = asyncio.run(after())
    assert current == gen and moved.epoch == gen.epoch + 1
    assert cluster.master_of(ns_key) == replica and back < 20.0, back
    print(f"failover under TLS: the store answered {back:.1f} s after the master's SIGKILL")
