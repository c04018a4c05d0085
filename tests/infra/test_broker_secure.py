"""`chunkserve broker start --secure`: an embedded Apache Kafka whose clients sign in on
SASL_SSL, with a CA, a certificate and a user per role made once in its folder and the ACL
table applied for the configured prefix. What it prints works in a shell; each role gets only
its own topics; the users outlive a restart; a folder made without it is refused with it."""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infra.apache_kafka import java_available
from schemas.errors import AccessDeniedError
from schemas.records import ScaleOut, SessionOpened
from streams.config import KafkaSettings, Settings
from streams.kafka import RecordProducer
from streams.preflight import check
from streams.signing import CommandKeys, EventKeys
from streams.topics import ensure_topics

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(not java_available(), reason="Apache Kafka needs Java")]

PREFIX = "loc."


def _env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("CHUNKSERVE_")},
            "CHUNKSERVE_TOPIC_PREFIX": PREFIX}


def _start(data: Path, *options: str) -> tuple[subprocess.Popen[str], list[str]]:
    """``broker start`` on ``data`` and what it printed up to its last export."""
    cli = subprocess.Popen([sys.executable, "-m", "infra", "broker", "start", "--data", str(data), *options],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env())
    lines: list[str] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and cli.poll() is None and not any(
            "CHUNKSERVE_PROVISIONER_KAFKA_SASL_USERNAME" in ln for ln in lines):
        lines.append(cli.stdout.readline())  # type: ignore[union-attr]
    return cli, lines


def _stop(cli: subprocess.Popen[str]) -> int:
    cli.send_signal(signal.SIGTERM)
    return cli.wait(60)


def _exported(lines: list[str]) -> dict[str, str]:
    """The variables the printed lines set, as a shell sets them."""
    script = "set -e\n" + "".join(ln for ln in lines if ln.startswith("export ")) + "env -0\n"
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, env={}).stdout
    return dict(item.split("=", 1) for item in out.split("\0") if item.startswith("CHUNKSERVE_"))


def _settings(env: dict[str, str], role: str | None = None) -> Settings:
    user = env[f"CHUNKSERVE_{role.upper()}_KAFKA_SASL_USERNAME"] if role else env["CHUNKSERVE_KAFKA_SASL_USERNAME"]
    password = env[f"CHUNKSERVE_{role.upper()}_KAFKA_SASL_PASSWORD"] if role else env["CHUNKSERVE_KAFKA_SASL_PASSWORD"]
    kafka = KafkaSettings(env["CHUNKSERVE_KAFKA_BOOTSTRAP"], security_protocol="SASL_SSL",
                          sasl_mechanism=env["CHUNKSERVE_KAFKA_SASL_MECHANISM"], sasl_username=user,
                          sasl_password=password, ssl_cafile=env["CHUNKSERVE_KAFKA_SSL_CAFILE"])
    return Settings(kafka=kafka, topic_prefix=PREFIX, namespace="loc")


def test_broker_start_secure(tmp_path: Path) -> None:
    data = tmp_path / "kafka"
    cli, lines = _start(data, "--secure")
    try:
        env = _exported(lines)
        admin = _settings(env)
        asyncio.run(check(admin, {}, redis=False, timeout_s=20))
        asyncio.run(ensure_topics(admin))

        async def send(settings: Settings, record: object) -> None:
            async with RecordProducer(settings) as producer:
                await producer.send(record)

        # the producer role (its password from its file) writes session-events; the worker may not
        # write scaling-commands: the table's ACLs are in place
        producer = _settings({**env, "CHUNKSERVE_KAFKA_SASL_USERNAME": "producer",
                              "CHUNKSERVE_KAFKA_SASL_PASSWORD": (data / "secrets" / "producer.password").read_text().strip()})
        asyncio.run(send(producer, SessionOpened(session_id="s-1", ts=1.0, prompt="p")))
        with pytest.raises(AccessDeniedError, match="'User:worker' write on topic loc.scaling-commands"):
            asyncio.run(send(_settings(env, "worker"), ScaleOut(pool="default", count=1, gpu_type="cpu", ts=1.0)))
    finally:
        assert _stop(cli) == 0
    text = "".join(lines)
    secrets = data / "secrets"
    assert stat.S_IMODE(secrets.stat().st_mode) == 0o700
    assert not list(secrets.glob("other-ca*")) and not (secrets / "server.csr").exists()  # tests' and signing's files
    for path in [*secrets.glob("*.password"), secrets / "command-keys", secrets / "event-keys"]:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text().strip() not in text
    # signed commands by default: an Ed25519 key whose public half `up` hands its readers
    assert env["CHUNKSERVE_COMMAND_KEYS"].startswith("local:ed25519:")
    assert CommandKeys.from_env(env).verify_only().startswith("local:ed25519-pub:")
    # and signed worker-events: the masters, which `up` hands each worker only its own key of
    assert EventKeys.from_env(env).checks and env["CHUNKSERVE_EVENT_KEYS"].startswith("local:")
    assert f"ACL bindings applied for the topic prefix '{PREFIX}'" in text
    # the node's properties hold every user's password (JAAS), its data every record: both the
    # owner's alone (they were 644 in 755 folders, readable by any local account)
    node = data / "node-1"
    assert stat.S_IMODE(node.stat().st_mode) == 0o700
    assert stat.S_IMODE((node / "server.properties").stat().st_mode) == 0o600
    assert env["CHUNKSERVE_KAFKA_SASL_PASSWORD"] in (node / "server.properties").read_text()

    # started again on its folder: the same users sign in
    cli, lines = _start(data, "--secure")
    try:
        assert _exported(lines)["CHUNKSERVE_KAFKA_SASL_PASSWORD"] == env["CHUNKSERVE_KAFKA_SASL_PASSWORD"]
        asyncio.run(check(_settings(env, "dispatch"), {}, redis=False, timeout_s=20))
    finally:
        assert _stop(cli) == 0
    # without --secure the folder is refused (its users and listeners are made at format time)
    plain = subprocess.run([sys.executable, "-m", "infra", "broker", "start", "--data", str(data)],
                           capture_output=True, text=True, env=_env(), timeout=120)
    out = [ln for ln in plain.stderr.splitlines() if ln.strip()]
    assert plain.returncode == 2 and len(out) == 1 and "made with --secure: start it with --secure" in out[0], out


def test_a_plaintext_folder_is_refused_with_secure_before_any_secret_is_made(tmp_path: Path) -> None:
    """Refused, it had written a CA and its key, the server's key and nine passwords first."""
    from infra.apache_kafka import EmbeddedKafka

    EmbeddedKafka(tmp_path / "plain")  # its cluster.json: a plaintext cluster's folder
    done = subprocess.run([sys.executable, "-m", "infra", "broker", "start", "--data", str(tmp_path / "plain"),
                           "--secure"], capture_output=True, text=True, env=_env(), timeout=120)
    out = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert done.returncode == 2 and len(out) == 1 and "made without --secure" in out[0], done.stdout + done.stderr
    assert not (tmp_path / "plain" / "secrets").exists()

