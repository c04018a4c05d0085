"""Apache Kafka on one machine: a pinned release from Maven Central, started in KRaft mode.

``ensure_kafka`` copies the broker's jars into a cache folder on first use (Maven, the pom
beside this module); ``EmbeddedKafka`` formats and starts one broker, or a cluster of N
combined broker+controller nodes (replicated as ``streams.topics.replication_for`` says:
three copies, two in sync, where there are three nodes), on free loopback ports with data
folders on disk. It can kill, pause, resume and restart any node, or all of them, on the
same folders: the log survives. With ``security`` (a :class:`KafkaSecurity`) clients reach it
on SASL_SSL only, as users created at format time, under the StandardAuthorizer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from infra.outputs import hold_folder, lock_holder
from schemas.errors import InfraError
from workers.supervision import spawn

__all__ = ["KAFKA_VERSION", "EmbeddedKafka", "KafkaNode", "KafkaSecurity", "ensure_kafka",
           "java_available", "kafka_home"]

log = logging.getLogger(__name__)

KAFKA_VERSION = "4.1.1"
_POM = Path(__file__).with_name("kafka") / "pom.xml"
_LOG4J = """status = error
appender.f.type = File
appender.f.name = F
appender.f.fileName = {path}
appender.f.layout.type = PatternLayout
appender.f.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.f.ref = F
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.state.name = state.change.logger
logger.state.level = warn
"""


def java_available(path: str | None = None) -> bool:
    """Whether a ``java`` is on ``path`` (default: this process's PATH)."""
    return shutil.which("java", path=path) is not None


def kafka_home() -> Path:
    """Where the jars live: ``CHUNKSERVE_KAFKA_HOME``, else the user's cache folder."""
    configured = os.environ.get("CHUNKSERVE_KAFKA_HOME")
    if configured:
        return Path(configured)
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "chunkserve" / f"kafka-{KAFKA_VERSION}"


def ensure_kafka(home: Path | None = None) -> Path:
    """The folder of the broker's jars, fetched from Maven Central when it is not there yet."""
    home = home or kafka_home()
    jars = home / "libs"
    if (jars / f"kafka_2.13-{KAFKA_VERSION}.jar").exists():
        return jars
    mvn = shutil.which("mvn")
    if mvn is None:
        raise InfraError(f"Apache Kafka {KAFKA_VERSION} is not in {jars} and there is no `mvn` "
                         "to fetch it (install Maven, or set CHUNKSERVE_KAFKA_BOOTSTRAP)")
    # said on stderr: a mistyped CHUNKSERVE_KAFKA_HOME fetched 43 MB into a new folder without a word
    print(f"fetching Apache Kafka {KAFKA_VERSION} from Maven Central into {home} (once; "
          f"{'CHUNKSERVE_KAFKA_HOME' if os.environ.get('CHUNKSERVE_KAFKA_HOME') else 'the cache folder'})",
          file=sys.stderr, flush=True)
    home.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix="libs-", dir=home))
    cmd = [mvn, "-q", "-B", "-f", str(_POM), f"-Dkafka.version={KAFKA_VERSION}",
           "dependency:copy-dependencies", f"-DoutputDirectory={staging}", "-DincludeScope=runtime"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        raise InfraError(f"fetching Apache Kafka {KAFKA_VERSION} with Maven failed: {' | '.join(tail)}")
    with contextlib.suppress(OSError):  # a racing fetch may have put its copy in place first
        staging.rename(jars)
    shutil.rmtree(staging, ignore_errors=True)
    return jars


def _free_ports(n: int) -> list[int]:
    import socket

    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class KafkaNode:
    """One combined broker+controller: its id, ports, folder and process."""

    node_id: int
    port: int
    controller_port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


_SCRAM = "org.apache.kafka.common.security.scram.ScramLoginModule"
_PLAIN = "org.apache.kafka.common.security.plain.PlainLoginModule"


@dataclass(frozen=True)
class KafkaSecurity:
    """Clients on SASL_SSL only: the broker's certificate (``cert``/``key``, signed by ``ca``),
    ``users`` (name -> password) able to sign in with SCRAM-SHA-512, SCRAM-SHA-256 (created at
    format time) or PLAIN, and the StandardAuthorizer with ``admin`` its only super user.

    The nodes speak to each other as ``admin`` too: SCRAM-SHA-512 between brokers, PLAIN on
    the controller listener (KRaft's controllers cannot take SCRAM there). No ACL is created:
    every other user may do nothing until ``streams.kafka_acls`` grants it.
    """

    ca: Path
    cert: Path
    key: Path
    users: Mapping[str, str]
    admin: str = "admin"

    MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")

    def __post_init__(self) -> None:
        if self.admin not in self.users:
            raise InfraError(f"the admin {self.admin!r} needs a password in users")
        for name, password in self.users.items():  # they go into JAAS strings and format arguments
            if not name.replace("-", "").replace("_", "").isalnum() or not password.isalnum():
                raise InfraError(f"user {name!r}: names are letters, digits, - and _; passwords "
                                 "letters and digits")

    def properties(self, folder: Path) -> dict[str, str]:
        """The node's security properties; writes its PEM keystore (key, then certificate)."""
        keystore = folder / "keystore.pem"
        keystore.write_text(self.key.read_text() + self.cert.read_text())
        keystore.chmod(0o600)
        me = f'username="{self.admin}" password="{self.users[self.admin]}"'
        plain_users = " ".join(f'user_{u}="{p}"' for u, p in self.users.items())
        return {
            "inter.broker.listener.name": "SASL_SSL",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "sasl.mechanism.controller.protocol": "PLAIN",
            "listener.name.sasl_ssl.sasl.enabled.mechanisms": ",".join(self.MECHANISMS),
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": f"{_SCRAM} required {me};",
            "listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config": f"{_SCRAM} required;",
            "listener.name.sasl_ssl.plain.sasl.jaas.config": f"{_PLAIN} required {plain_users};",
            "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
            "listener.name.controller.plain.sasl.jaas.config":
                f'{_PLAIN} required {me} user_{self.admin}="{self.users[self.admin]}";',
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
            "ssl.client.auth": "none",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "super.users": f"User:{self.admin}",
            "allow.everyone.if.no.acl.found": "false",
        }

    def format_args(self) -> list[str]:
        """``StorageTool format`` arguments creating every user's SCRAM credentials."""
        return [arg for user, password in self.users.items() for mech in self.MECHANISMS[:2]
                for arg in ("--add-scram", f"{mech}=[name={user},password={password}]")]

    def client(self, user: str | None = None, mechanism: str = "SCRAM-SHA-512",
               cafile: Path | None = None) -> dict[str, Any]:
        """``streams.config.KafkaSettings`` fields for ``user`` (default the admin)."""
        user = user or self.admin
        return {"security_protocol": "SASL_SSL", "sasl_mechanism": mechanism,
                "sasl_username": user, "sasl_password": self.users[user],
                "ssl_cafile": str(cafile or self.ca)}


def security_mismatch(root: Path, secure: bool) -> str | None:
    """Why a cluster folder cannot be started ``secure`` (or not): its users and listeners are
    made when its storage is formatted. None when it can (or holds no cluster yet)."""
    saved = root / "cluster.json"
    if not saved.exists():
        return None
    made = bool(json.loads(saved.read_text()).get("secure", False))
    if made == secure:
        return None
    return f"{root} holds a cluster made " + ("with --secure: start it with --secure" if made else
                                              "without --secure (plaintext, no users): start it without, or give "
                                              "another folder")


@dataclass
class EmbeddedKafka:
    """Apache Kafka in KRaft combined mode: ``brokers`` nodes with their folders under ``root``.

    Each node logs to ``root/node-<id>/server.log``. ``config`` adds or overrides broker
    properties (every node gets the same). ``security`` puts clients on SASL_SSL under ACLs.
    """

    root: Path
    brokers: int = 1
    heap_mb: int = 384
    config: dict[str, str] = field(default_factory=dict)
    security: KafkaSecurity | None = None
    nodes: list[KafkaNode] = field(default_factory=list)
    cluster_id: str = field(default_factory=lambda: _cluster_id())
    _held: int | None = field(default=None, init=False, repr=False)  # the locked folder's descriptor

    kind = "apache-kafka"
    version = KAFKA_VERSION

    def __post_init__(self) -> None:
        if self.nodes:
            return
        for outer in self.root.parents:  # a folder inside a running broker's is that broker's
            holder = lock_holder(outer / "broker.lock")
            if holder is not None:
                raise InfraError(f"{self.root} is inside {outer}, the data folder of a running broker "
                                 f"(pid {holder}): give a data folder outside it")
        # a folder that held a cluster before keeps its ports, so clients find it again
        saved = self.root / "cluster.json"
        if saved.exists():
            doc = json.loads(saved.read_text())
            if len(doc["nodes"]) != self.brokers:
                raise InfraError(f"{self.root} holds a cluster of {len(doc['nodes'])} brokers, "
                                 f"not {self.brokers}")
            mismatch = security_mismatch(self.root, self.security is not None)
            if mismatch:
                raise InfraError(mismatch)
            self.cluster_id = doc["cluster_id"]
            pairs = [tuple(n) for n in doc["nodes"]]
        else:
            ports = _free_ports(2 * self.brokers)
            pairs = [(ports[2 * i], ports[2 * i + 1]) for i in range(self.brokers)]
        self.nodes = [KafkaNode(i + 1, port, cport, self.root / f"node-{i + 1}")
                      for i, (port, cport) in enumerate(pairs)]
        if not saved.exists():
            self.root.mkdir(parents=True, exist_ok=True)
            self._save()

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    @property
    def pid(self) -> int | None:
        """The first node's process id while it runs (benchmarks sample its CPU)."""
        node = self.nodes[0]
        return node.proc.pid if node.running and node.proc is not None else None

    def describe(self) -> dict[str, object]:
        """What benchmarks and chaos runs report as ``"broker"``."""
        return {"kind": self.kind, "version": self.version, "brokers": self.brokers}

    def admin_kwargs(self) -> dict[str, Any]:
        """aiokafka keyword arguments of the cluster's admin (plaintext without security)."""
        if self.security is None:
            return {"bootstrap_servers": self.bootstrap}
        from streams.config import KafkaSettings

        return KafkaSettings(self.bootstrap, **self.security.client()).client_kwargs()

    def properties(self, node: KafkaNode) -> dict[str, str]:
        from streams.topics import replication_for

        rf, isr = (str(n) for n in replication_for(self.brokers))
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        listener = "SASL_SSL" if self.security else "PLAINTEXT"
        props = {
            "process.roles": "broker,controller",
            "node.id": str(node.node_id),
            "controller.quorum.voters": voters,
            "listeners": f"{listener}://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:{node.controller_port}",
            "advertised.listeners": f"{listener}://127.0.0.1:{node.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(node.folder / "data"),
            "num.partitions": "1",
            # a topic is made by `chunkserve topics` (or a process's start) with its partitions and
            # bounds, never by a client naming it: a producer on the wrong prefix fails, not
            # writes where no processor reads
            "auto.create.topics.enable": "false",
            "default.replication.factor": rf,
            "min.insync.replicas": isr,
            "offsets.topic.replication.factor": rf,
            "offsets.topic.num.partitions": "8",
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": isr,
            "group.initial.rebalance.delay.ms": "0",
            "num.network.threads": "2",
            "num.io.threads": "2",
            "num.recovery.threads.per.data.dir": "2",
            "log.cleaner.threads": "1",
            "unclean.leader.election.enable": "false",
            # a killed node is fenced (and its partitions led elsewhere) after 3 s, and a
            # restarted one may register again that soon (the default waits 9 s)
            "broker.session.timeout.ms": "3000",
            "broker.heartbeat.interval.ms": "500",
        }
        if self.security is not None:
            node.folder.mkdir(parents=True, exist_ok=True)
            props.update(self.security.properties(node.folder))
        props.update(self.config)
        return props

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout_s: float = 90.0) -> "EmbeddedKafka":
        """Format the folders that are new, start every node, wait until all serve. The folder
        is locked while this process runs it: a second start on it is refused (it would run
        a second node in the live node's metadata folder)."""
        jars = ensure_kafka()
        self._lock()
        fresh = not any((node.folder / "data" / "meta.properties").exists() for node in self.nodes)
        for tries_left in (2, 1, 0):
            for node in self.nodes:
                self._write_config(node)
                if not (node.folder / "data" / "meta.properties").exists():
                    self._format(node, jars)
            for node in self.nodes:
                self._launch(node, jars)
            try:
                self.wait_ready(timeout_s)
                return self
            except InfraError:
                self.stop()
                if not (fresh and tries_left and self._port_taken()):
                    raise
            # a port picked free was taken before the node bound it (by any process's outgoing
            # connection: a CI run's bench broker exited so): a new cluster starts again on new ones
            self._new_ports()
        raise AssertionError("unreachable")

    def _port_taken(self) -> bool:
        """Whether a node's log says one of its ports was in use."""
        return any("Address already in use" in (node.folder / name).read_text(errors="replace")
                   for node in self.nodes for name in ("server.log", "stdout.log") if (node.folder / name).exists())

    def _new_ports(self) -> None:
        """New free ports for a cluster that has served nothing yet, its folders formatted afresh."""
        ports = _free_ports(2 * self.brokers)
        for i, node in enumerate(self.nodes):
            node.port, node.controller_port = ports[2 * i], ports[2 * i + 1]
            shutil.rmtree(node.folder / "data", ignore_errors=True)
            for name in ("server.log", "stdout.log"):
                (node.folder / name).unlink(missing_ok=True)
        self._save()

    def _save(self) -> None:
        """The cluster's id and ports in its folder: started again on it, clients find it there."""
        (self.root / "cluster.json").write_text(json.dumps({
            "cluster_id": self.cluster_id, "nodes": [[n.port, n.controller_port] for n in self.nodes],
            "secure": self.security is not None}))

    def wait_ready(self, timeout_s: float = 90.0, nodes: list[KafkaNode] | None = None) -> None:
        """Block until ``nodes`` (default all running ones) are registered and answer metadata;
        ``nodes`` given (a restart), each on its own listener: a node SIGKILLed stays registered
        for the controller's session timeout, so the cluster's metadata said a restarted one
        served about 5 s before it did (an outside run's `broker start` printed it)."""
        wanted = {n.node_id for n in (nodes or [n for n in self.nodes if n.running])}
        asks = [{**self.admin_kwargs(), "bootstrap_servers": n.address} for n in nodes] if nodes else [self.admin_kwargs()]
        deadline = time.monotonic() + timeout_s
        last: object = None
        quiet = logging.getLogger("aiokafka")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            while time.monotonic() < deadline:
                for node in self.nodes:
                    if node.proc is not None and node.proc.poll() is not None:
                        raise InfraError(f"Kafka node {node.node_id} exited with {node.proc.returncode}; "
                                         f"see {node.folder / 'server.log'}")
                try:
                    seen = set.intersection(*(asyncio.run(_registered(ask)) for ask in asks))
                    if wanted <= seen:
                        return
                    last = f"brokers registered: {sorted(seen)}"
                except Exception as exc:  # still starting: connection refused, timeouts
                    last = exc
                time.sleep(0.2)
        finally:
            quiet.setLevel(level)
        raise InfraError(f"Kafka at {self.bootstrap} not ready within {timeout_s}s: {last}")

    def _lock(self) -> None:
        if self._held is not None:
            return
        self.root.mkdir(parents=True, exist_ok=True)
        self._held = hold_folder(self.root / "broker.lock", "a running broker")

    def stop(self, timeout_s: float = 15.0) -> None:
        """Stop every node: SIGTERM (controlled shutdown), SIGKILL what is left at the end."""
        for node in self.nodes:
            if node.running:
                _signal(node, signal.SIGCONT)
                _signal(node, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for node in self.nodes:
            if node.proc is None:
                continue
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=10)
            node.proc = None
        if self._held is not None:
            os.close(self._held)  # the folder's lock goes with it
            self._held = None

    def kill(self, node_id: int) -> None:
        """SIGKILL one node (a crash: no controlled shutdown, nothing flushed on purpose)."""
        node = self.node(node_id)
        if node.proc is not None:
            _signal(node, signal.SIGKILL)
            node.proc.wait(timeout=10)
            node.proc = None

    def kill_all(self) -> None:
        for node in self.nodes:
            self.kill(node.node_id)

    def pause(self, node_id: int) -> None:
        _signal(self.node(node_id), signal.SIGSTOP)

    def resume(self, node_id: int) -> None:
        _signal(self.node(node_id), signal.SIGCONT)

    def restart(self, node_id: int, timeout_s: float = 90.0) -> None:
        """Start a stopped or killed node again on its own folder; wait until it serves."""
        node = self.node(node_id)
        if node.running:
            self.kill(node_id)
        self._launch(node, ensure_kafka())
        self.wait_ready(timeout_s, [node])

    def restart_all(self, timeout_s: float = 90.0) -> None:
        jars = ensure_kafka()
        for node in self.nodes:
            if not node.running:
                self._launch(node, jars)
        self.wait_ready(timeout_s)

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise KeyError(f"no Kafka node {node_id}")

    def pids(self) -> dict[int, int]:
        return {n.node_id: n.proc.pid for n in self.nodes if n.proc is not None}

    # -- private --------------------------------------------------------------------------

    def _write_config(self, node: KafkaNode) -> None:
        # the node's folder is its owner's alone: its properties hold every SASL user's password
        # (JAAS), its data every record (both were readable by any local account)
        node.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        node.folder.chmod(0o700)
        text = "".join(f"{k}={v}\n" for k, v in self.properties(node).items())
        path = node.folder / "server.properties"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        path.chmod(0o600)
        level = os.environ.get("CHUNKSERVE_KAFKA_LOG_LEVEL", "info")
        (node.folder / "log4j2.properties").write_text(
            _LOG4J.format(path=node.folder / "server.log", level=level))

    def _java(self, node: KafkaNode, jars: Path, main: str, *args: str) -> list[str]:
        return ["java", f"-Xms{min(128, self.heap_mb)}m", f"-Xmx{self.heap_mb}m",
                "-XX:+UseSerialGC",
                "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={node.folder / 'log4j2.properties'}",
                "-cp", f"{jars}/*", main, *args]

    def _format(self, node: KafkaNode, jars: Path) -> None:
        cmd = self._java(node, jars, "kafka.tools.StorageTool", "format", f"--cluster-id={self.cluster_id}",
                         "-c", str(node.folder / "server.properties"), "--ignore-formatted",
                         *(self.security.format_args() if self.security else ()))
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip()[-400:]
            for password in (self.security.users.values() if self.security else ()):
                said = said.replace(password, "***")
            raise InfraError(f"formatting Kafka node {node.node_id} failed: {said}")

    def _launch(self, node: KafkaNode, jars: Path) -> None:
        cmd = self._java(node, jars, "kafka.Kafka", str(node.folder / "server.properties"))
        with open(node.folder / "stdout.log", "ab") as out:
            # a supervised child: it dies with this process, even when that is killed outright
            node.proc = spawn(cmd, os.environ, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding."""
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def _signal(node: KafkaNode, sig: int) -> None:
    if node.proc is not None and node.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(node.proc.pid, sig)


async def _registered(client: dict[str, Any]) -> set[int]:
    """Ids of the brokers the cluster's metadata lists."""
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(**client, request_timeout_ms=3000)
    await admin.start()
    try:
        info = await admin.describe_cluster()
        return {b["node_id"] for b in info["brokers"]}
    finally:
        await admin.close()
