"""One metrics processor per topic prefix, on the real broker and Redis: a second is refused
in one line before its agents start, one whose lease another process took stops (code 2), and
a clean stop frees the place."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from streams.config import Settings
from streams.config_file import child_env
from streams.store_records import Keys
from streams.topics import ensure_topics

pytestmark = pytest.mark.integration


def _start(settings: Settings, log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "infra", "processor", "metrics"], env=child_env(settings),
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _holding(client: redis.Redis, key: str, proc: subprocess.Popen[bytes], timeout_s: float = 120) -> str:
    """The lease's token once ``proc`` holds it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the metrics processor exited with {proc.returncode}"
        token = client.get(key)
        if token is not None and f":{proc.pid}:" in token.decode():
            return token.decode()
        time.sleep(0.2)
    raise AssertionError(f"the metrics processor took no lease within {timeout_s} s")


def test_a_second_metrics_processor_is_refused_and_a_taken_over_one_stops(kafka_bootstrap, redis_url, namespace,
                                                                          tmp_path):
    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    asyncio.run(ensure_topics(settings))
    client = redis.Redis.from_url(redis_url)
    key = Keys(namespace).lease(f"metrics:{namespace}.")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        procs.append(first := _start(settings, tmp_path / "first.log"))
        _holding(client, key, first)
        second = subprocess.run([sys.executable, "-m", "infra", "processor", "metrics"], env=child_env(settings),
                                capture_output=True, text=True, timeout=180)
        client.set(key, "elsewhere:4242:abcd", px=60_000)  # as if its lease had run out and been taken
        first_rc = first.wait(timeout=60)
        holder_after = client.get(key)
        client.delete(key)
        procs.append(third := _start(settings, tmp_path / "third.log"))
        _holding(client, key, third)
        third.send_signal(signal.SIGTERM)
        third_rc = third.wait(timeout=60)
        freed = client.exists(key)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        client.close()
    out = second.stdout + second.stderr
    assert second.returncode == 2 and "Traceback" not in out, out
    assert not second.stdout.strip()
    line = second.stderr.strip().splitlines()[-1]  # the command's own error: its last line
    assert line.startswith(f"configuration error: a metrics processor of topic prefix '{namespace}.' is running "
                           f"already (") and f":{first.pid})" in line  # the live one, by host and pid
    assert line.endswith("; run one per topic prefix (one that stopped without a clean shutdown frees its "
                         "place within 5 s)")
    first_log = (tmp_path / "first.log").read_text()
    assert first_rc == 2, first_log[-2000:]
    assert f"the metrics processor of topic prefix '{namespace}.' was taken over by another (elsewhere:4242)" in first_log
    assert holder_after == b"elsewhere:4242:abcd"  # its stop left the new holder's lease alone
    assert third_rc == 0 and freed == 0  # a clean stop frees the place at once
