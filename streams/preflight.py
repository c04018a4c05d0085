"""Check the configured endpoints before a command starts: one line per wrong setting.

:func:`check` reads the TLS files, reaches the broker (through TLS and SASL as configured)
and Redis, and raises a :class:`~schemas.errors.ConfigError` naming the setting and where
it came from (the file, or ``env CHUNKSERVE_...``) when one fails, so a wrong address,
certificate or password is reported in one line rather than as a client's traceback.
"""

from __future__ import annotations

import asyncio
import logging
import re
import ssl
from typing import Any, Iterator, Mapping
from urllib.parse import urlsplit

from schemas.errors import ConfigError

from .config import Settings
from .config_file import env_var

__all__ = ["check", "origin"]

_KAFKA_FILES = ("kafka.ssl_cafile", "kafka.ssl_certfile", "kafka.ssl_keyfile")
_REDIS_FILES = ("redis.ssl_ca_certs", "redis.ssl_certfile", "redis.ssl_keyfile")


def origin(key: str, sources: Mapping[str, str]) -> str:
    """Where ``key`` was set: the file, ``env VARIABLE``, or the default."""
    return sources.get(key) or f"default (set {key} in the --config file or {env_var(key)})"


def _value(settings: Settings, key: str) -> Any:
    section, _, name = key.partition(".")
    return getattr(getattr(settings, section), name)


def _files(settings: Settings, sources: Mapping[str, str], keys: tuple[str, ...]) -> None:
    for key in keys:
        path = _value(settings, key)
        if not path:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            raise ConfigError(key, f"cannot read {path} ({exc.strerror})", origin(key, sources)) from None


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    return parts._replace(netloc=parts.netloc.replace(f":{parts.password}@", ":***@")).geturl()


class _Collect(logging.Handler):
    """Keeps what aiokafka logs during the check (and keeps it off the terminal)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _Quiet:
    def __init__(self, name: str) -> None:
        self.logger = logging.getLogger(name)
        self.handler = _Collect()

    def __enter__(self) -> _Collect:
        self.propagate = self.logger.propagate
        self.logger.addHandler(self.handler)
        self.logger.propagate = False
        return self.handler

    def __exit__(self, *exc: object) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = self.propagate


def _closed(protocol: str, bootstrap: str) -> str:
    """A listener took the connection and closed it: it speaks another security protocol."""
    wants = [w for w, has in (("TLS", "SSL" in protocol), ("SASL", "SASL" in protocol)) if not has]
    return (f"the listener at {bootstrap} took the connection and closed it at the first request "
            f"over {protocol}: it may ask for {' and '.join(wants) or 'another protocol'}; set it as "
            "the broker's listener is configured (PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL)")


def _kafka_blame(settings: Settings, sources: Mapping[str, str], said: str) -> Iterator[ConfigError]:
    """The setting a failed bootstrap points at, from what the client logged."""
    k = settings.kafka
    if "SaslAuthenticationFailed" in said or "Authentication failed" in said:
        yield ConfigError("kafka.sasl_username", f"the broker at {k.bootstrap} refused the SASL "
                          f"{k.sasl_mechanism or 'PLAIN'} credentials of {k.sasl_username!r} (password from "
                          f"{env_var('kafka.sasl_password')})", origin("kafka.sasl_username", sources))
    elif "CERTIFICATE_VERIFY_FAILED" in said or "SSL" in said and "SSL" in k.security_protocol:
        yield ConfigError("kafka.ssl_cafile", f"TLS with the broker at {k.bootstrap} failed: the "
                          "certificate authority does not verify its certificate (or it does not "
                          "speak TLS)", origin("kafka.ssl_cafile", sources))
    elif re.search(r"KafkaConnectionError: Connection at \S+ closed", said):
        yield ConfigError("kafka.security_protocol", _closed(k.security_protocol, k.bootstrap),
                          origin("kafka.security_protocol", sources))
    yield ConfigError("kafka.bootstrap", f"no broker answers at {k.bootstrap}"
                      + (f" over {k.security_protocol}" if k.security_protocol != "PLAINTEXT" else ""),
                      origin("kafka.bootstrap", sources))


async def _broker(settings: Settings, sources: Mapping[str, str], timeout_s: float) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.errors import KafkaError

    _files(settings, sources, _KAFKA_FILES)
    missing = settings.kafka.sasl_missing()
    if missing:
        raise ConfigError("kafka.security_protocol", missing, origin("kafka.security_protocol", sources))
    try:
        kwargs = settings.kafka.client_kwargs()
    except ssl.SSLError as exc:  # a file that is there but holds no usable PEM
        key = "kafka.ssl_certfile" if settings.kafka.ssl_certfile else "kafka.ssl_cafile"
        raise ConfigError(key, f"not a usable certificate or key ({exc.reason or exc})",
                          origin(key, sources)) from None
    admin = AIOKafkaAdminClient(**kwargs, request_timeout_ms=int(timeout_s * 1000))
    with _Quiet("aiokafka") as seen:
        try:
            await asyncio.wait_for(admin.start(), timeout_s)
        except (KafkaError, OSError, asyncio.TimeoutError):
            raise next(_kafka_blame(settings, sources, " ".join(seen.messages))) from None
        finally:
            await admin.close()


async def _redis(settings: Settings, sources: Mapping[str, str], timeout_s: float) -> None:
    import redis.exceptions as rx

    _files(settings, sources, _REDIS_FILES)
    try:
        client = settings.redis.async_client()
    except ValueError as exc:  # redis-py refuses the URL's form
        raise ConfigError("redis.url", str(exc), origin("redis.url", sources)) from None
    url = _redacted(settings.redis.url)
    try:
        try:
            await _ping(client, settings, sources, url, timeout_s)
        except ConfigError as exc:  # its node down: a cluster's other seeds are asked by the store's read
            if not (settings.redis.seeds and exc.key == "redis.url" and "no Redis answers" in str(exc)):
                raise
            return await _store_access(settings, sources, timeout_s)
        try:  # a mode the Redis does not have was an 88-line traceback (on), or a late MovedError (off)
            enabled = bool(int((await asyncio.wait_for(client.info("cluster"), timeout_s)).get("cluster_enabled", 0)))
        except (rx.RedisError, OSError, asyncio.TimeoutError, ValueError):
            enabled = None  # INFO not granted to this user: the store's own read says what it finds
    finally:
        await client.aclose()
    if enabled is not None and enabled != (settings.redis.cluster == "on"):
        raise ConfigError("redis.cluster", f"{settings.redis.cluster}, and the Redis at {url} is "
                          + ("a Redis Cluster node: set it on (CHUNKSERVE_REDIS_CLUSTER=on)" if enabled else
                             "not a cluster node (cluster support disabled): set it off"),
                          origin("redis.cluster", sources))
    if settings.redis.cluster == "on":
        await _store_access(settings, sources, timeout_s)


async def _ping(client: Any, settings: Settings, sources: Mapping[str, str], url: str, timeout_s: float) -> None:
    import redis.exceptions as rx

    try:
        await asyncio.wait_for(client.ping(), timeout_s)
    except rx.AuthenticationError:
        key = "redis.username" if settings.redis.username else "redis.url"
        user = settings.redis.username or urlsplit(settings.redis.url).username or "default"
        raise ConfigError(key, f"Redis at {url} refused the credentials of user {user!r} (password from "
                          f"{env_var('redis.password')} or the URL)", origin(key, sources)) from None
    except (rx.ConnectionError, rx.TimeoutError, OSError, asyncio.TimeoutError) as exc:
        detail = str(exc).split("\n")[0][:160] or type(exc).__name__
        key = "redis.ssl_ca_certs" if "CERTIFICATE_VERIFY_FAILED" in detail else "redis.url"
        raise ConfigError(key, f"no Redis answers at {url} ({detail})", origin(key, sources)) from None
    except rx.ResponseError as exc:  # e.g. NOAUTH: a password is required
        raise ConfigError("redis.url", f"Redis at {url} said {str(exc)[:160]}",
                          origin("redis.url", sources)) from None


async def _store_access(settings: Settings, sources: Mapping[str, str], timeout_s: float) -> None:
    """The store's own read on its namespace's slot master: the user's ACL must allow the slot
    map, the scripts and the namespace's keys (a write it lacks is refused when it comes)."""
    from schemas.errors import AccessDeniedError, InfraError

    from .generations import GenerationStore

    store = GenerationStore.from_settings(settings)
    try:
        await asyncio.wait_for(store.load_view(), timeout_s)
    except AccessDeniedError as exc:
        key = "redis.username" if settings.redis.username else "redis.url"
        raise ConfigError(key, str(exc), origin(key, sources)) from None
    except (InfraError, asyncio.TimeoutError) as exc:
        raise ConfigError("redis.url", f"the Redis Cluster at {_redacted(settings.redis.url)}: "
                          f"{exc or 'no answer'}", origin("redis.url", sources)) from None
    finally:
        await store.aclose()


async def check(settings: Settings, sources: Mapping[str, str], *, kafka: bool = True, redis: bool = True,
                timeout_s: float = 10.0) -> None:
    """Raise a ConfigError for the first configured endpoint that cannot be used."""
    if kafka:
        await _broker(settings, sources, timeout_s)
    if redis:
        await _redis(settings, sources, timeout_s)
