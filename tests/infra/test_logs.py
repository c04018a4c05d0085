"""A processor's log file holds log lines, one JSON object each when asked; no control codes."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest

from infra.logs import logging_config
from schemas.topics import SESSION_EVENTS
from streams.config import Settings
from streams.config_file import child_env

pytestmark = pytest.mark.integration


def test_the_formats_are_text_and_json():
    assert logging_config("json")["formatters"]["default"]["()"].endswith("JsonFormatter")
    assert "()" not in logging_config("text")["formatters"]["default"]
    with pytest.raises(ValueError, match="choose from text, json"):
        logging_config("xml")


def test_a_processor_logs_json_lines_to_its_file(kafka_bootstrap, redis_url, namespace, tmp_path):
    from streams.kafka import RecordProducer
    from streams.topics import ensure_topics

    settings = Settings(topic_prefix=f"{namespace}.", namespace=namespace).with_endpoints(kafka_bootstrap, redis_url)
    asyncio.run(ensure_topics(settings))
    path = tmp_path / "detector.log"
    with open(path, "wb") as out:  # as `up` and the provisioner start their children
        proc = subprocess.Popen([sys.executable, "-m", "infra", "processor", "detector"],
                                env={**child_env(settings), "CHUNKSERVE_LOG_FORMAT": "json"},
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    async def garbage() -> None:
        async with RecordProducer(settings, client_id="test-logs") as producer:
            await producer.send_raw(SESSION_EVENTS, b"\x81\xa1t\xa4nope", key=b"g")

    try:
        asyncio.run(garbage())
        deadline = time.monotonic() + 90
        while b"dead-lettering" not in path.read_bytes():
            assert time.monotonic() < deadline, path.read_text(errors="replace")[-2000:]
            assert proc.poll() is None, path.read_text(errors="replace")[-2000:]
            time.sleep(0.5)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    raw = path.read_bytes()
    assert b"\x1b" not in raw  # no spinner, no colours
    lines = [json.loads(line) for line in raw.decode().splitlines() if line.strip()]
    assert {"ts", "level", "logger", "pid", "message"} <= set(lines[0])
    (letter,) = [x for x in lines if "dead-lettering" in x["message"]]
    assert letter["level"] == "WARNING" and letter["logger"] == "streams.faust_app"
    assert any("command signing is off" in x["message"] for x in lines)


def test_a_message_repeated_within_the_window_is_held_back_and_counted():
    """A client retrying a broker that is down logged `Unable connect to node` about 40 times
    a second; the same text from the same logger shows once per window, then with a count."""
    import logging

    from infra.logs import Repeats

    now = [0.0]
    kept = Repeats(window_s=30.0, clock=lambda: now[0])

    def said(msg: str, *args: object, name: str = "aiokafka") -> str | None:
        rec = logging.LogRecord(name, logging.ERROR, __file__, 1, msg, args, None)
        return rec.getMessage() if kept.filter(rec) else None

    assert said("Unable connect to node %d", 1) == "Unable connect to node 1"
    for step in range(40):
        now[0] += 0.5
        assert said("Unable connect to node %d", 1) is None
    assert said("Unable connect to node %d", 2) == "Unable connect to node 2"  # another text passes
    assert said("Unable connect to node %d", 1, name="other") == "Unable connect to node 1"  # another logger too
    now[0] = 30.0
    assert said("Unable connect to node %d", 1) == "Unable connect to node 1 (40 more like it in the last 30 s)"
    assert logging_config("text")["handlers"]["default"]["filters"] == ["repeats"]
