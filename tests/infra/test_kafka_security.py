"""Transport security on the real broker: Apache Kafka with clients on SASL_SSL only (SCRAM
users made at format time, a test CA), the StandardAuthorizer, and the ACLs of
``streams.kafka_acls`` applied by ``chunkserve acls --apply``. Every role runs as its own
principal; what the ACLs, the password check and the certificate check refuse is refused by
the broker and reported in one line. One secured broker serves the whole module.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest
from aiokafka import TopicPartition
from typer.testing import CliRunner

from infra.apache_kafka import EmbeddedKafka, KafkaSecurity, java_available
from infra.cli import app
from infra.flow import run_flow
from infra.local import LocalFleet
from schemas.errors import AccessDeniedError, ConfigError
from schemas.records import (Assign, CostTick, Generation, PlacementReport, Record, ScaleOut,
                             SessionOpened, WorkloadSignal)
from schemas.topics import METRICS, SCALING_COMMANDS, SESSION_EVENTS, topic_of
from streams.config import KafkaSettings, Settings
from streams.kafka import RecordConsumer, RecordProducer
from streams.kafka_acls import ROLES, bindings, current_acls
from streams.preflight import check
from streams.signing import EventKeys
from streams.topics import ensure_topics
from tests.infra.test_node_producer import ROOT, _node_example
from tests.tls import make_pki

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not java_available(), reason="Apache Kafka needs Java")]


@dataclass(frozen=True)
class Secured:
    broker: EmbeddedKafka
    security: KafkaSecurity
    other_ca: Path  # a CA that did not sign the broker's certificate
    redis_url: str

    def settings(self, user: str = "admin", prefix: str = "sec.", **client: object) -> Settings:
        kafka = KafkaSettings(self.broker.bootstrap, **{**self.security.client(user), **client})
        return Settings(kafka=kafka, topic_prefix=prefix,
                        namespace=prefix.strip(".")).with_endpoints(self.broker.bootstrap, self.redis_url)

    def env(self, user: str) -> dict[str, str]:
        return {"CHUNKSERVE_KAFKA_SASL_USERNAME": user,
                "CHUNKSERVE_KAFKA_SASL_PASSWORD": self.security.users[user]}


def _apply(settings: Settings) -> None:
    """``chunkserve acls --apply`` for ``settings``' prefix, as the admin (through the CLI)."""
    k = settings.kafka
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": k.bootstrap, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": k.sasl_mechanism, "CHUNKSERVE_KAFKA_SASL_USERNAME": k.sasl_username,
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": k.sasl_password, "CHUNKSERVE_KAFKA_SSL_CAFILE": k.ssl_cafile,
           "CHUNKSERVE_TOPIC_PREFIX": settings.topic_prefix}
    result = CliRunner().invoke(app, ["acls", "--apply"], env=env)
    assert result.exit_code == 0, result.output
    assert f"applied {len(bindings(settings.topic_prefix))} ACL bindings" in result.output


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory, redis_url: str) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    pki = make_pki(root / "pki")
    users = {name: secrets.token_hex(12) for name in ("admin", *ROLES)}
    security = KafkaSecurity(pki.ca, pki.cert, pki.key, users)
    broker = EmbeddedKafka(root / "kafka", security=security).start()
    try:
        s = Secured(broker, security, pki.other_ca, redis_url)
        asyncio.run(ensure_topics(s.settings()))
        _apply(s.settings())
        yield s
    finally:
        broker.stop()


def test_the_cluster_holds_exactly_the_acl_table(secured: Secured) -> None:
    admin = secured.settings()
    wanted = set(bindings("sec."))
    _apply(admin)  # applied again: nothing added twice
    assert {b for b in asyncio.run(current_acls(admin)) if b.name.startswith("sec.")} == wanted
    printed = CliRunner().invoke(app, ["acls", "--print"], env={"CHUNKSERVE_TOPIC_PREFIX": "sec."}).output
    lines = printed.splitlines()
    assert len(lines) == len(wanted)
    assert ("--allow-principal User:worker --operation Read --topic sec.worker-commands "
            "--resource-pattern-type literal") in printed
    assert not any("User:worker" in ln and "Write" in ln and "worker-commands" in ln for ln in lines)


def test_acls_apply_by_a_principal_not_the_admin_is_one_short_line(secured: Secured) -> None:
    k = secured.settings("worker").kafka
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": k.bootstrap, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": k.sasl_mechanism, "CHUNKSERVE_KAFKA_SASL_USERNAME": "worker",
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": k.sasl_password, "CHUNKSERVE_KAFKA_SSL_CAFILE": k.ssl_cafile,
           "CHUNKSERVE_TOPIC_PREFIX": "sec-other."}
    before = asyncio.run(current_acls(secured.settings()))
    done = subprocess.run([sys.executable, "-m", "infra", "acls", "--apply"], env=env, capture_output=True,
                          text=True, timeout=120)
    out = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 1 and len(out) == 1, done.stdout + done.stderr
    assert "refused principal 'User:worker' Alter on the cluster (creating ACLs)" in out[0], out
    assert "admin's credentials" in out[0] and len(out[0]) < 240 and "Traceback" not in done.stderr
    assert asyncio.run(current_acls(secured.settings())) == before  # nothing was made


@pytest.mark.parametrize("mechanism", KafkaSecurity.MECHANISMS)
def test_each_mechanism_signs_in_and_records_flow_under_the_acls(secured: Secured, mechanism: str) -> None:
    async def run() -> list[str]:
        producer_settings = secured.settings("producer", sasl_mechanism=mechanism)
        reader = secured.settings("detector", sasl_mechanism=mechanism)
        await check(producer_settings, {}, redis=False)
        sid = f"s-{mechanism}-{secrets.token_hex(3)}"
        async with RecordProducer(producer_settings) as producer:
            meta = await producer.send(SessionOpened(session_id=sid, ts=time.time(), prompt="p"))
        consumer = RecordConsumer(reader, [SESSION_EVENTS], None, name="t")
        await consumer.start(subscribe=False)
        try:
            tp = TopicPartition(meta.topic, meta.partition)
            consumer.raw.assign([tp])
            consumer.raw.seek(tp, meta.offset)
            got: list[str] = []
            deadline = time.monotonic() + 15
            while sid not in got and time.monotonic() < deadline:
                got += [d.record.session_id for d in await consumer.poll()]  # type: ignore[attr-defined]
            return got
        finally:
            await consumer.stop()

    assert asyncio.run(run())[0].startswith(f"s-{mechanism}")


def _end_offsets(settings: Settings, logical: str) -> int:
    async def run() -> int:
        consumer = RecordConsumer(settings, [logical], None, name="t")
        await consumer.start(subscribe=False)
        try:
            tps = [TopicPartition(consumer.catalogue.name(logical), p) for p in await consumer.partitions(logical)]
            return sum((await consumer.raw.end_offsets(tps)).values())
        finally:
            await consumer.stop()
    return asyncio.run(run())


@pytest.mark.parametrize("user,record", [
    ("producer", Assign(worker_id="w-1", session_id="s-1", generation=Generation("w-1", 1), ts=1.0)),
    ("worker", Assign(worker_id="w-1", session_id="s-1", generation=Generation("w-1", 1), ts=1.0)),
    ("worker", ScaleOut(pool="default", count=1, gpu_type="cpu", ts=1.0)),
])
def test_a_write_outside_the_role_is_refused_by_the_broker(secured: Secured, user: str, record: Record) -> None:
    logical = topic_of(record)
    before = _end_offsets(secured.settings(), logical)

    async def run() -> None:
        async with RecordProducer(secured.settings(user)) as producer:
            await producer.send(record)

    with pytest.raises(AccessDeniedError) as refused:
        asyncio.run(run())
    line = str(refused.value)
    assert line == (f"the broker refused principal 'User:{user}' write on topic sec.{logical} "
                    "(TopicAuthorizationFailedError)")
    assert _end_offsets(secured.settings(), logical) == before  # nothing reached the log


def _cli_env(secured: Secured, user: str = "worker", password: bool = False) -> dict[str, str]:
    """The CLI's variables for ``user`` on the module's broker (``password``: its own too)."""
    k = secured.settings(user).kafka
    env = {"CHUNKSERVE_KAFKA_BOOTSTRAP": k.bootstrap, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "CHUNKSERVE_KAFKA_SASL_USERNAME": user,
           "CHUNKSERVE_KAFKA_SSL_CAFILE": str(k.ssl_cafile), "CHUNKSERVE_REDIS_URL": secured.redis_url,
           "CHUNKSERVE_TOPIC_PREFIX": "sec.", "COLUMNS": "400"}
    return env | ({"CHUNKSERVE_KAFKA_SASL_PASSWORD": secured.security.users[user]} if password else {})


def test_replay_and_story_run_as_the_read_only_auditor(secured: Secured, tmp_path: Path) -> None:
    """An operator folds the log as the auditor principal, which reads what `replay` and
    `story` read and writes nothing; the watcher, which reads only `watch`'s two topics, is
    refused in one line (before, the README said to run them as the admin)."""
    sid = f"s-audit-{secrets.token_hex(3)}"

    async def open_one() -> None:
        async with RecordProducer(secured.settings("producer")) as producer:
            await producer.send(SessionOpened(session_id=sid, ts=time.time(), prompt="p"))

    asyncio.run(open_one())
    runner = CliRunner()
    story = runner.invoke(app, ["story", sid, "--json", str(tmp_path / "story.json")], env=_cli_env(secured, "auditor", password=True))
    assert story.exit_code == 0, story.output
    told = json.loads((tmp_path / "story.json").read_text())
    assert told["records"] >= 1 and told["undecodable"] == 0
    replay = runner.invoke(app, ["replay", "control", "--json", str(tmp_path / "replay.json")],
                           env=_cli_env(secured, "auditor", password=True))
    assert replay.exit_code == 0, replay.output
    assert sid in (tmp_path / "replay.json").read_text()
    refused = subprocess.run([sys.executable, "-m", "infra", "story", sid], capture_output=True, text=True,
                             env={**os.environ, **_cli_env(secured, "watcher", password=True)}, timeout=120)
    assert refused.returncode == 1 and "refused principal 'User:watcher'" in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_wrong_password_or_an_untrusted_certificate_is_refused(secured: Secured) -> None:
    def refusal(settings: Settings) -> str:
        with pytest.raises(ConfigError) as exc:
            asyncio.run(check(settings, {}, redis=False, timeout_s=5))
        return str(exc.value)

    for mechanism in KafkaSecurity.MECHANISMS:
        said = refusal(secured.settings("worker", sasl_mechanism=mechanism, sasl_password="not-it"))
        assert f"refused the SASL {mechanism} credentials of 'worker'" in said
    said = refusal(secured.settings("worker", ssl_cafile=str(secured.other_ca)))
    assert "kafka.ssl_cafile: TLS with the broker" in said and "does not verify its certificate" in said
    said = refusal(secured.settings("worker", security_protocol="PLAINTEXT"))  # no TLS, no SASL
    assert "kafka.security_protocol: the listener at" in said and "may ask for TLS and SASL" in said
    said = refusal(secured.settings("worker", security_protocol="SSL"))  # TLS without SASL
    assert "kafka.security_protocol: the listener at" in said and "over SSL: it may ask for SASL;" in said

    # and from the command line: one line, exit code 2, the principal named
    env = {**os.environ, **_cli_env(secured), "CHUNKSERVE_KAFKA_SASL_PASSWORD": "not-it"}
    done = subprocess.run([sys.executable, "-m", "infra", "topics"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    out = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(out) == 1 and not done.stdout.strip() and "refused the SASL SCRAM-SHA-512 credentials of 'worker'" in out[0], out
    assert "env CHUNKSERVE_KAFKA_SASL_USERNAME: kafka.sasl_username:" in out[0]
    assert "CHUNKSERVE_KAFKA_SASL_PASSWORD" in out[0] and "not-it" not in done.stdout + done.stderr
    assert "Traceback" not in done.stderr




def test_end_to_end_with_every_role_as_its_own_principal(secured: Secured, namespace: str,
                                                         tmp_path: Path) -> None:
    """Dispatch (faust) and a torch worker serve sessions a producer principal opened, while
    detector, metrics and control (faust) and the provisioner run beside them, each as its
    own principal under the table's ACLs; no process is refused anything."""
    admin = secured.settings(prefix=f"{namespace}.")
    asyncio.run(ensure_topics(admin))
    _apply(admin)
    role_env = {role: secured.env(role) for role in ROLES}
    # the workers the provisioner starts sign in as the worker principal (else as its own)
    role_env["provisioner"] |= {"CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME": "worker",
                                "CHUNKSERVE_WORKER_KAFKA_SASL_PASSWORD": secured.security.users["worker"]}
    others = LocalFleet(admin, tmp_path / "others", role_env=role_env,
                        extra_env={"CHUNKSERVE_COST_INTERVAL_S": "1", "CHUNKSERVE_CONTROL_PERIOD_S": "1",
                                   "CHUNKSERVE_MIN_WORKERS": "1", "CHUNKSERVE_MAX_WORKERS": "1"})
    try:
        for name in ("detector", "metrics", "control"):
            others.start_processor(name)
        others.start_provisioner()
        summary = asyncio.run(run_flow(admin, tmp_path / "flow", sessions=2, chunks=3, workers=1,
                                       inputs=2, chunk_interval_s=0.02, timeout_s=90, garbage=2,
                                       role_env=role_env, client_settings=secured.settings(
                                           "producer", prefix=f"{namespace}.")))
        assert summary.problems == [] and summary.sessions == 2
        assert all(summary.inputs_accepted[s] == [1, 2] for s in summary.chunk_indices)
        # the garbage on session-events is dead-lettered by each of its three readers, each as itself
        assert sorted(d.consumer for d in summary.letters) == ["detector", "dispatch", "dispatch", "metrics"]
        def published(rs: list[Record]) -> set[str]:
            return ({"detector"} if any(isinstance(r, WorkloadSignal) for r in rs) else set()) | \
                ({"metrics"} if any(isinstance(r, CostTick) for r in rs) else set()) | \
                ({"control"} if any(isinstance(r, PlacementReport) and r.source == "control" for r in rs) else set())

        records = asyncio.run(_metrics_until(admin, lambda rs: len(published(rs)) == 3, timeout_s=30))
        assert published(records) == {"detector", "metrics", "control"}
        assert all(others.alive().values()), others.alive()
    finally:
        others.stop_all()
    for log in [*(tmp_path / "others").glob("*.log"), *(tmp_path / "flow").glob("*.log")]:
        text = log.read_text(errors="replace")
        assert "AuthorizationFailed" not in text and "refused principal" not in text, log.name


def test_the_node_producer_signs_in_over_sasl_ssl(secured: Secured, namespace: str, tmp_path: Path) -> None:
    """The kafkajs example, configured as the contract's ``cluster-sasl-ssl`` server says (the
    cluster's CA, SCRAM), serves sessions with dispatch and a worker signed in as their own
    principals, as the client role: the producer's writes, worker-events, dead-letters and its
    groups (one prefixed binding). It signed in as the admin before that role was there."""
    script = _node_example(tmp_path)
    prefix = f"{namespace}."
    admin = secured.settings(prefix=prefix)
    asyncio.run(ensure_topics(admin))
    _apply(admin)
    fleet = LocalFleet(admin, tmp_path / "logs", role_env={role: secured.env(role) for role in ROLES})
    k = admin.kafka
    env = {**os.environ, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL", "CHUNKSERVE_KAFKA_SSL_CAFILE": str(k.ssl_cafile),
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256", "CHUNKSERVE_KAFKA_SASL_USERNAME": "client",
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": secured.security.users["client"]}
    command = ["node", str(script), "--bootstrap", k.bootstrap, "--prefix", prefix, "--sessions", "2",
               "--inputs", "2", "--timeout-s", "90", "--contract", str(ROOT / "docs" / "asyncapi.json")]
    try:
        fleet.start_processor("dispatch")
        fleet.start_worker("worker-0", capacity=3, chunk_interval_s=0.05)
        node = subprocess.run(command, env=env, capture_output=True, text=True, timeout=150)
        wrong = subprocess.run(command, env={**env, "CHUNKSERVE_KAFKA_SASL_PASSWORD": "not-it"},
                               capture_output=True, text=True, timeout=150)
    finally:
        fleet.stop_all()
    assert node.returncode == 0, f"stdout: {node.stdout[-2000:]}\nstderr: {node.stderr[-4000:]}"
    summary = json.loads(node.stdout.strip().splitlines()[-1])
    assert summary["pushed"] == summary["accepted"] == 4 and summary["closed"] == 2 and summary["refused"] == []
    assert wrong.returncode != 0 and "SASL" in wrong.stdout + wrong.stderr, wrong.stdout + wrong.stderr


async def _metrics_until(settings: Settings, done: Callable[[list[Record]], bool],
                         timeout_s: float) -> list[Record]:
    consumer = RecordConsumer(settings, [METRICS], None, name="t")
    await consumer.start(subscribe=False)
    seen: list[Record] = []
    try:
        await consumer.assign({METRICS: None})
        deadline = time.monotonic() + timeout_s
        while not done(seen) and time.monotonic() < deadline:
            seen += [d.record for d in await consumer.poll()]
        return seen
    finally:
        await consumer.stop()


def test_a_read_outside_the_role_is_refused_by_the_broker(secured: Secured) -> None:
    """A worker reading scaling-commands (only control and the provisioner may)."""
    async def run() -> None:
        consumer = RecordConsumer(secured.settings("worker"), [SCALING_COMMANDS], None, name="t")
        await consumer.start(subscribe=False)
        try:
            consumer.raw.assign([TopicPartition(f"sec.{SCALING_COMMANDS}", 0)])
            for _ in range(50):
                await consumer.poll(timeout_ms=100)
        finally:
            await consumer.stop()

    with pytest.raises(AccessDeniedError) as refused:
        asyncio.run(run())
    assert str(refused.value) == ("the broker refused principal 'User:worker' read on topic "
                                  "sec.scaling-commands (TopicAuthorizationFailedError)")


def test_a_faust_processor_the_broker_refuses_at_start_up_says_so_in_one_line(secured: Secured) -> None:
    """The detector run as the metrics principal, which may not use the detector's consumer
    group (a faust consumer refused its group retries without a word): the process ends with
    one line naming the principal, the operation and the group (exit code 1), no traceback.
    The refusals faust itself meets at start-up (its leader topic, its idempotent producer)
    become the same line; their messages are the ones this broker gave."""
    from aiokafka.errors import ClusterAuthorizationFailedError, TopicAuthorizationFailedError

    from streams.faust_app import start_refusal

    env = {**os.environ, **_cli_env(secured), **secured.env("metrics")}
    done = subprocess.run([sys.executable, "-m", "infra", "processor", "detector"], env=env, capture_output=True,
                          text=True, timeout=90)
    assert done.returncode == 1, done.stdout + done.stderr
    out = [ln for ln in done.stderr.splitlines() if "AuthorizationFailed" in ln]  # the processor's logs say nothing of it
    assert out == ["error: the broker refused principal 'User:metrics' read on group sec.detector "
                   "(GroupAuthorizationFailedError)"], out
    assert "Traceback" not in done.stderr and not done.stdout.strip(), done.stderr

    leader = TopicAuthorizationFailedError("Cannot create topic: sec.detector-__assignor-__leader (29): "
                                           "Authorization failed.")
    assert str(start_refusal(leader, "metrics")) == ("the broker refused principal 'User:metrics' create on topic "
                                                     "sec.detector-__assignor-__leader (TopicAuthorizationFailedError)")
    assert str(start_refusal(ClusterAuthorizationFailedError(), "watcher")).startswith(
        "the broker refused principal 'User:watcher' IdempotentWrite on the cluster")
    assert start_refusal(RuntimeError("other"), "metrics") is None


def test_workers_the_provisioner_starts_run_as_the_worker_principal(secured: Secured, tmp_path: Path) -> None:
    """The provisioner runs as its own principal; given CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME /
    _PASSWORD the workers it starts sign in to the broker as the worker principal and serve
    (WorkerUp, no refusal); without them a worker signs in as the provisioner, which may not
    even see worker-commands, and stops with one line saying so."""
    from schemas.records import WorkerUp
    from schemas.topics import WORKER_EVENTS
    from workers.provisioner import LocalProcessProvisioner, worker_credentials

    pw = secured.security.users["worker"]
    creds = worker_credentials({"CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME": "worker",
                                "CHUNKSERVE_WORKER_KAFKA_SASL_PASSWORD": pw})
    assert creds == ("worker", pw) and worker_credentials({}) is None
    with pytest.raises(ConfigError, match="CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME: set "
                                          "CHUNKSERVE_WORKER_KAFKA_SASL_PASSWORD with it"):
        worker_credentials({"CHUNKSERVE_WORKER_KAFKA_SASL_USERNAME": "worker"})

    async def run(credentials: tuple[str, str] | None, pool: str) -> tuple[bool, str]:
        """Whether the worker announced itself, and its log."""
        prov = LocalProcessProvisioner(secured.settings("provisioner"), pool, capacity=1, log_dir=tmp_path,
                                       chunk_interval_s=0.05, worker_credentials=credentials)
        events = RecordConsumer(secured.settings(), [WORKER_EVENTS], None, name="t")
        await events.start(subscribe=False)
        try:
            await events.assign({WORKER_EVENTS: None}, "end")
            (wid,) = await prov.start(1, "cpu")
            log = tmp_path / f"{wid}.log"
            deadline, up = time.monotonic() + 60, False
            while time.monotonic() < deadline and not up:
                up = any(isinstance(d.record, WorkerUp) and d.record.worker_id == wid
                         for d in await events.poll(timeout_ms=200))
                if credentials is None and "refused principal" in log.read_text(errors="replace"):
                    break
            if up:
                await asyncio.sleep(2.0)  # it reads worker-commands once it has announced itself
            return up, log.read_text(errors="replace")
        finally:
            await events.stop()
            await prov.close()

    up, said = asyncio.run(run(creds, "as-worker"))
    assert up and "Authenticated as worker via SCRAM-SHA-512" in said, said[-2000:]
    assert "Authenticated as provisioner" not in said and "refused principal" not in said, said[-2000:]
    assert "Traceback" not in said, said[-2000:]
    _, said = asyncio.run(run(None, "as-provisioner"))  # the control: the provisioner's principal
    assert "Authenticated as provisioner via SCRAM-SHA-512" in said and "as worker" not in said, said[-2000:]
    assert ("error: the broker refused principal 'User:provisioner' describe on topic sec.worker-commands "
            "(TopicAuthorizationFailedError)") in said and "Traceback" not in said, said[-2000:]


def _descendants(pid: int) -> list[tuple[str, dict[str, str]]]:
    """The command line and environment of each live descendant of ``pid``."""
    import psutil

    out = []
    for child in psutil.Process(pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):
            out.append((" ".join(child.cmdline()), child.environ()))
    return out


def test_up_starts_each_role_as_its_own_principal(secured: Secured, namespace: str, tmp_path: Path) -> None:
    """`up` signed in as the admin, given CHUNKSERVE_<ROLE>_KAFKA_SASL_USERNAME / _PASSWORD,
    starts each processor, the provisioner and (through it) a worker as the role's principal
    under the table's ACLs, and no child holds another principal's password."""
    prefix = f"{namespace}."
    admin = secured.settings(prefix=prefix)
    asyncio.run(ensure_topics(admin))
    _apply(admin)
    users = secured.security.users
    k = admin.kafka
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": k.bootstrap, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "CHUNKSERVE_KAFKA_SASL_USERNAME": "admin",
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": users["admin"], "CHUNKSERVE_KAFKA_SSL_CAFILE": str(k.ssl_cafile),
           "CHUNKSERVE_REDIS_URL": secured.redis_url, "CHUNKSERVE_TOPIC_PREFIX": prefix,
           "CHUNKSERVE_NAMESPACE": namespace, "CHUNKSERVE_MIN_WORKERS": "1", "CHUNKSERVE_MAX_WORKERS": "1",
           "CHUNKSERVE_WORKER_CAPACITY": "2", "CHUNKSERVE_EVENT_KEYS": f"ev:{'cd' * 32}"}
    roles = ("dispatch", "detector", "control", "metrics", "provisioner", "worker")
    for role in roles:
        env[f"CHUNKSERVE_{role.upper()}_KAFKA_SASL_USERNAME"] = role
        env[f"CHUNKSERVE_{role.upper()}_KAFKA_SASL_PASSWORD"] = users[role]
    logs, said = tmp_path / "logs", tmp_path / "up.out"
    with open(said, "w") as out:
        up = subprocess.Popen([sys.executable, "-m", "infra", "up", "--log-dir", str(logs)], env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    given: dict[str, str] = {}  # each descendant's Kafka user name
    held: dict[str, set[str]] = {}  # and the passwords among its variables
    signs: dict[str, tuple[str | None, str | None]] = {}  # and its worker-events keys: masters, its own
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any("--worker-id" in name for name, _ in _descendants(up.pid)):
            assert up.poll() is None, said.read_text()[-3000:]
            time.sleep(1)
        time.sleep(15)  # a child refused by the broker exits meanwhile, and `up` (or the provisioner) says so
        for name, environ in _descendants(up.pid):
            worker_id = name.split("--worker-id ")[1].split()[0] if "--worker-id " in name else ""
            name = " ".join(name.split()[3:5])
            signs[name] = (environ.get("CHUNKSERVE_EVENT_KEYS"),
                           environ.get("CHUNKSERVE_WORKER_EVENT_KEY") if not worker_id else
                           environ.get("CHUNKSERVE_WORKER_EVENT_KEY") == EventKeys.from_env(env).for_worker(worker_id))
            given[name] = environ.get("CHUNKSERVE_KAFKA_SASL_USERNAME", "")
            held[name] = {v for v in environ.values() if v in users.values()}
    finally:
        up.send_signal(signal.SIGTERM)
        up.wait(timeout=90)
    text = said.read_text()
    assert given == {"processor dispatch": "dispatch", "processor detector": "detector",
                     "processor control": "control", "processor metrics": "metrics",
                     "provisioner --worker-metrics-port": "provisioner", "worker --worker-id": "worker"} or \
        given == {"processor dispatch": "dispatch", "processor detector": "detector",
                  "processor control": "control", "processor metrics": "metrics",
                  "provisioner": "provisioner", "worker --worker-id": "worker"}, (given, text[-3000:])
    assert all(v == {users[given[k]]} for k, v in held.items() if not k.startswith("provisioner")), held
    assert held[next(k for k in held if k.startswith("provisioner"))] == {users["provisioner"], users["worker"]}
    # worker-events' masters with the processes that check or write them for any worker; the
    # worker holds only its own key, the detector none
    master = env["CHUNKSERVE_EVENT_KEYS"]
    assert {k.split()[-1] if k.startswith("processor") else k.split()[0]: v for k, v in signs.items()} == {
        "dispatch": (master, None), "detector": (None, None), "control": (master, None), "metrics": (master, None),
        "provisioner": (master, None), "worker": (None, True)}, signs
    assert "exited" not in text and "refused principal" not in text and up.returncode == 0, text[-3000:]
    assert "exited on its own" not in (logs / "provisioner.log").read_text(errors="replace")
    for log in logs.glob("*.log"):
        log_text = log.read_text(errors="replace")
        assert "refused principal" not in log_text and "AuthorizationFailed" not in log_text, (log.name, log_text[-2000:])


def test_up_names_a_role_whose_principal_the_broker_refuses(secured: Secured, namespace: str, tmp_path: Path) -> None:
    """A wrong role password had `up` start every child and its dispatch exit six times
    (`Unable to bootstrap`) before the fleet stopped, SASL named in the child's log only. `up`
    signs in as each role first: one line naming the role's variables, exit code 2, no child."""
    k = secured.settings().kafka
    users = secured.security.users
    env = {**os.environ, "CHUNKSERVE_KAFKA_BOOTSTRAP": k.bootstrap, "CHUNKSERVE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
           "CHUNKSERVE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512", "CHUNKSERVE_KAFKA_SASL_USERNAME": "admin",
           "CHUNKSERVE_KAFKA_SASL_PASSWORD": users["admin"], "CHUNKSERVE_KAFKA_SSL_CAFILE": str(k.ssl_cafile),
           "CHUNKSERVE_REDIS_URL": secured.redis_url, "CHUNKSERVE_TOPIC_PREFIX": f"{namespace}.",
           "CHUNKSERVE_NAMESPACE": namespace, "CHUNKSERVE_CONTROL_KAFKA_SASL_USERNAME": "control",
           "CHUNKSERVE_CONTROL_KAFKA_SASL_PASSWORD": users["control"],
           "CHUNKSERVE_DISPATCH_KAFKA_SASL_USERNAME": "dispatch", "CHUNKSERVE_DISPATCH_KAFKA_SASL_PASSWORD": "not-it"}
    done = subprocess.run([sys.executable, "-m", "infra", "up", "--log-dir", str(tmp_path / "logs")], env=env,
                          capture_output=True, text=True, timeout=120)
    out = [ln for ln in done.stderr.splitlines() if ln.strip() and "command signing is off" not in ln]
    assert done.returncode == 2 and len(out) == 1, done.stdout + done.stderr
    assert ("CHUNKSERVE_DISPATCH_KAFKA_SASL_USERNAME: the dispatch role's own principal: the broker refused the "
            "SASL SCRAM-SHA-512 credentials of 'dispatch' (password from CHUNKSERVE_DISPATCH_KAFKA_SASL_PASSWORD)") in out[0]
    assert "not-it" not in done.stdout + done.stderr and not (tmp_path / "logs").exists()


def test_topics_run_by_a_principal_that_may_not_make_them_says_so(secured: Secured) -> None:
    """`chunkserve topics` as the worker, on a prefix whose topics are not there, listed them
    with `partitions=?` and exited 0; it now says none could be made, naming the principal."""
    env = {**os.environ, **_cli_env(secured), "CHUNKSERVE_KAFKA_SASL_PASSWORD": secured.security.users["worker"],
           "CHUNKSERVE_TOPIC_PREFIX": "nowhere."}
    done = subprocess.run([sys.executable, "-m", "infra", "topics"], env=env, capture_output=True, text=True, timeout=120)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "Traceback" not in said, done.stdout + done.stderr
    assert "error: 7 of 7 topics are not on the broker, or not visible to principal User:worker" in said, said
