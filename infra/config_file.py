"""Settings from a TOML file, then ``CHUNKSERVE_*`` environment variables over it.

Secrets (the Kafka SASL password, the Redis password) come from the environment only: a
secret in the file is an error. Every error is a ``ConfigError`` naming the key and where
it came from (the file, the file and line for TOML syntax, or the variable)::

    topic_prefix = "chunkserve."      namespace = "cs"      max_record_bytes = 1048576
    [kafka]  bootstrap, security_protocol, sasl_mechanism, sasl_username,
             ssl_cafile, ssl_certfile, ssl_keyfile
    [redis]  url, username, ssl_ca_certs, ssl_certfile, ssl_keyfile
    [partitions]  "session-events" = 8, ...
"""

from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from schemas.errors import ConfigError
from streams.config import (DEFAULT_PARTITIONS, ENV_PREFIX, KafkaSettings, RedisSettings,
                            Settings)

__all__ = ["load_settings", "SECRETS"]

_KAFKA = ("bootstrap", "security_protocol", "sasl_mechanism", "sasl_username", "ssl_cafile",
          "ssl_certfile", "ssl_keyfile")
_REDIS = ("url", "username", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
_TOP = ("topic_prefix", "namespace", "max_record_bytes")
SECRETS = {"kafka.sasl_password": "KAFKA_SASL_PASSWORD", "redis.password": "REDIS_PASSWORD"}
# dotted key -> environment variable (without the prefix)
_ENV = {**{f"kafka.{k}": f"KAFKA_{k.upper()}" for k in _KAFKA},
        **{f"redis.{k}": f"REDIS_{k.upper()}" for k in _REDIS},
        **{k: k.upper() for k in _TOP}, **SECRETS}


def load_settings(path: Path | None, env: Mapping[str, str] = os.environ) -> Settings:
    """Settings from ``path`` (None: defaults), overridden by the ``CHUNKSERVE_*`` in ``env``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    partitions = dict(DEFAULT_PARTITIONS)
    if path is not None:
        source = str(path)
        doc = _read(path)
        values, file_parts = _flatten(doc, source)
        partitions.update(file_parts)
        sources = {k: source for k in values} | {f"partitions.{t}": source for t in file_parts}
    for key, var in _ENV.items():
        raw = env.get(ENV_PREFIX + var)
        if raw:
            values[key] = raw
            sources[key] = f"env {ENV_PREFIX}{var}"
    if "max_record_bytes" in values and isinstance(values["max_record_bytes"], str):
        raw = values["max_record_bytes"]
        if not raw.isdigit():
            raise ConfigError("max_record_bytes", f"not an integer: {raw[:40]!r}", sources["max_record_bytes"])
        values["max_record_bytes"] = int(raw)
    return _build(values, partitions, sources)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError("<file>", f"cannot read: {exc.strerror or exc}", str(path)) from None
    except UnicodeDecodeError as exc:
        raise ConfigError("<file>", f"not UTF-8 (byte {exc.start})", str(path)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        found = re.search(r"line (\d+)", str(exc))
        where = f"{path}:{found.group(1)}" if found else str(path)
        raise ConfigError("<syntax>", str(exc), where) from None
    except (ValueError, RecursionError) as exc:  # e.g. deeply nested arrays
        raise ConfigError("<syntax>", f"unreadable TOML: {type(exc).__name__}", str(path)) from None


def _flatten(doc: dict[str, Any], source: str) -> tuple[dict[str, Any], dict[str, int]]:
    values: dict[str, Any] = {}
    parts: dict[str, int] = {}
    for key, value in doc.items():
        if key in ("kafka", "redis"):
            if not isinstance(value, dict):
                raise ConfigError(key, "must be a table", source)
            allowed = _KAFKA if key == "kafka" else _REDIS
            for sub, v in value.items():
                dotted = f"{key}.{sub}"
                if dotted in SECRETS:
                    raise ConfigError(dotted, "secrets are read from the environment only; set "
                                      f"{ENV_PREFIX}{SECRETS[dotted]} instead", source)
                if sub not in allowed:
                    raise ConfigError(dotted, f"unknown key (known: {', '.join(allowed)})", source)
                if not isinstance(v, str):
                    raise ConfigError(dotted, f"must be a string, got {type(v).__name__}", source)
                values[dotted] = v
        elif key == "partitions":
            if not isinstance(value, dict):
                raise ConfigError(key, "must be a table", source)
            for topic, n in value.items():
                if topic not in DEFAULT_PARTITIONS:
                    raise ConfigError(f"partitions.{topic}", "unknown topic", source)
                if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 100_000:
                    raise ConfigError(f"partitions.{topic}", f"must be an integer 1..100000, got {n!r}"[:200], source)
                parts[topic] = n
        elif key in ("topic_prefix", "namespace"):
            if not isinstance(value, str):
                raise ConfigError(key, f"must be a string, got {type(value).__name__}", source)
            values[key] = value
        elif key == "max_record_bytes":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(key, f"must be an integer, got {type(value).__name__}", source)
            values[key] = value
        else:
            raise ConfigError(key, "unknown key", source)
    return values, parts


def _build(values: dict[str, Any], partitions: dict[str, int], sources: dict[str, str]) -> Settings:
    def pick(prefix: str, keys: tuple[str, ...]) -> dict[str, Any]:
        return {k: values[f"{prefix}.{k}"] for k in keys if f"{prefix}.{k}" in values}

    try:
        kafka = KafkaSettings(**pick("kafka", _KAFKA + ("sasl_password",)))
        redis = RedisSettings(**pick("redis", _REDIS + ("password",)))
        top = {k: values[k] for k in _TOP if k in values}
        mrb = top.get("max_record_bytes")
        if mrb is not None and mrb > 1 << 30:
            raise ConfigError("max_record_bytes", "must be at most 1 GiB")
        return Settings(kafka=kafka, redis=redis, partitions=partitions, **top)
    except ConfigError as exc:  # re-raised naming where the offending value came from
        reason = str(exc).split(f"{exc.key}: ", 1)[-1]
        raise ConfigError(exc.key, reason, sources.get(exc.key, exc.source)) from None
