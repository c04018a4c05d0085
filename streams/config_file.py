"""Settings from a TOML file, then ``CHUNKSERVE_*`` environment variables over it.

One table (``KEYS``) names every setting, its type and its variable, so a file and the
environment can set the same things. Secrets (the Kafka SASL password, the Redis password)
come from the environment only: a secret in the file is an error. Every error is a
``ConfigError`` naming the key and where it came from (the file, the file and line for TOML
syntax, or the variable)::

    topic_prefix = "chunkserve."   namespace = "cs"
    max_record_bytes = 1048576     max_input_bytes = 65536     max_snapshot_bytes = 268435456
    input_rate_per_s = 50.0        input_burst = 100.0         max_sessions_per_worker = 64
    fetch_wait_ms = 100            store_retention_s = 3600
    [kafka]  bootstrap, security_protocol, sasl_mechanism, sasl_username,
             ssl_cafile, ssl_certfile, ssl_keyfile, idempotence ("on" / "off")
    [redis]  url, username, ssl_ca_certs, ssl_certfile, ssl_keyfile
    [partitions]    "session-events" = 8, ...      (CHUNKSERVE_PARTITIONS_SESSION_EVENTS)
    [record_bytes]  "session-inputs" = 131072, ... (CHUNKSERVE_RECORD_BYTES_SESSION_INPUTS)
"""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any, Mapping

from schemas.errors import ConfigError
from schemas.topics import TOPICS

from .config import (DEFAULT_PARTITIONS, ENV_PREFIX, PARENT_PID_ENV, PROVISIONER_ENV, KafkaSettings, RedisSettings,
                     Settings)

__all__ = ["load_settings", "load_with_sources", "settings_from_env", "child_env", "KEYS", "SECRETS", "env_var",
           "env_number", "SASL_ROLES", "role_sasl_env", "role_credentials"]

_KAFKA = ("bootstrap", "security_protocol", "sasl_mechanism", "sasl_username", "ssl_cafile",
          "ssl_certfile", "ssl_keyfile", "idempotence")
_REDIS = ("url", "username", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
SECRETS = ("kafka.sasl_password", "redis.password")
_PER_TOPIC = ("partitions", "record_bytes")  # tables of one positive integer per topic

# dotted key -> type of its value
KEYS: dict[str, type] = {
    "topic_prefix": str, "namespace": str, "store_retention_s": int,
    "max_record_bytes": int, "max_input_bytes": int, "input_rate_per_s": float,
    "input_burst": float, "max_snapshot_bytes": int, "max_sessions_per_worker": int,
    "fetch_wait_ms": int,
    **{f"kafka.{k}": str for k in _KAFKA + ("sasl_password",)},
    **{f"redis.{k}": str for k in _REDIS + ("password", "cluster", "seeds")},
    "redis.replica_acks": int, "redis.replica_ack_timeout_ms": int,
    **{f"{table}.{t}": int for table in _PER_TOPIC for t in TOPICS},
}
_MAX_INT = 1 << 30
_MAX_PARTITIONS = 100_000


def env_var(key: str) -> str:
    """The variable that sets ``key``: ``kafka.ssl_cafile`` -> ``CHUNKSERVE_KAFKA_SSL_CAFILE``."""
    return ENV_PREFIX + re.sub(r"[.-]", "_", key).upper()


def load_settings(path: Path | None, env: Mapping[str, str]) -> Settings:
    """Settings from ``path`` (None: defaults), overridden by the ``CHUNKSERVE_*`` in ``env``."""
    return load_with_sources(path, env)[0]


def load_with_sources(path: Path | None, env: Mapping[str, str]) -> tuple[Settings, dict[str, str]]:
    """The settings and where each set key came from: the file's path or ``env VARIABLE``."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    if path is not None:
        for key, value in _flatten(_read(path), str(path)).items():
            values[key], sources[key] = _typed(key, value, str(path)), str(path)
    for key in KEYS:
        raw = env.get(env_var(key))
        if raw:
            source = f"env {env_var(key)}"
            values[key], sources[key] = _parsed(key, raw, source), source
    _refuse_unknown_topic_vars(env)
    return _build(values, sources), sources


def _refuse_unknown_topic_vars(env: Mapping[str, str]) -> None:
    """A ``CHUNKSERVE_PARTITIONS_<TOPIC>`` or ``CHUNKSERVE_RECORD_BYTES_<TOPIC>`` naming no
    topic is refused, as the file's tables refuse one: a mistyped name would go unread."""
    for table in _PER_TOPIC:
        family = env_var(table) + "_"
        known = sorted(env_var(f"{table}.{t}")[len(family):] for t in TOPICS)
        for name in sorted(env):
            topic = name[len(family):]
            if name.startswith(family) and env[name] and topic not in known:
                raise ConfigError(f"{table}.{topic.lower().replace('_', '-')}",
                                  f"unknown topic (known: {', '.join(known)})", f"env {name}")


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


def _flatten(doc: dict[str, Any], source: str) -> dict[str, Any]:
    """``{"kafka": {"bootstrap": x}}`` -> ``{"kafka.bootstrap": x}``, refusing unknown keys."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if key in ("kafka", "redis") + _PER_TOPIC:
            if not isinstance(value, dict):
                raise ConfigError(key, "must be a table", source)
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    for key in flat:
        if key == "redis.url" and isinstance(flat[key], str) and _url_password(flat[key]):
            raise ConfigError(key, "holds a password; secrets are read from the environment only: "
                                   f"set {env_var('redis.password')} (or the whole URL in "
                                   f"{env_var('redis.url')}) instead", source)
        if key in SECRETS:
            raise ConfigError(key, f"secrets are read from the environment only; set {env_var(key)} "
                                   "instead", source)
        if key not in KEYS:
            section = key.split(".", 1)[0]
            known = sorted(k.split(".", 1)[1] for k in KEYS if k.startswith(section + ".")
                           and k not in SECRETS)
            hint = f" (known: {', '.join(known)})" if known else ""
            raise ConfigError(key, ("unknown topic" if section in _PER_TOPIC else "unknown key") + hint,
                              source)
    return flat


def _url_password(url: str) -> bool:
    from urllib.parse import urlsplit

    try:
        return bool(urlsplit(url).password)
    except ValueError:  # an unparsable URL is reported when it is used
        return False


def _typed(key: str, value: Any, source: str) -> Any:
    """A value from the file, checked against the type ``KEYS`` gives it."""
    kind = KEYS[key]
    ok = (isinstance(value, str) if kind is str else
          isinstance(value, int) and not isinstance(value, bool) if kind is int else
          isinstance(value, (int, float)) and not isinstance(value, bool))
    if not ok:
        raise ConfigError(key, f"must be {'a string' if kind is str else 'a number' if kind is float else 'an integer'}"
                               f", got {type(value).__name__}", source)
    return _ranged(key, float(value) if kind is float else value, source)


def _parsed(key: str, raw: str, source: str) -> Any:
    """A value from an environment variable, parsed to the type ``KEYS`` gives it."""
    kind = KEYS[key]
    if kind is str:
        return raw
    try:
        value = int(raw) if kind is int else float(raw)
    except ValueError:
        raise ConfigError(key, f"not {'an integer' if kind is int else 'a number'}: {raw[:40]!r}",
                          source) from None
    return _ranged(key, value, source)


_RANGES = {"redis.replica_acks": (0, 16), "fetch_wait_ms": (1, 60_000)}  # keys whose range is not 1.._MAX_INT


def _ranged(key: str, value: Any, source: str) -> Any:
    if key in _RANGES:
        low, top = _RANGES[key]
        if not low <= value <= top:
            raise ConfigError(key, f"must be from {low} to {top}, got {value!r}"[:200], source)
        return value
    top = _MAX_PARTITIONS if key.startswith("partitions.") else _MAX_INT
    if isinstance(value, (int, float)) and not (0 < value <= top):
        span = f"from 1 to {top}" if isinstance(value, int) else f"above 0, at most {top}"
        raise ConfigError(key, f"must be {span}, got {value!r}"[:200], source)
    return value


def _build(values: dict[str, Any], sources: dict[str, str]) -> Settings:
    def section(prefix: str) -> dict[str, Any]:
        return {k.split(".", 1)[1]: v for k, v in values.items() if k.startswith(prefix + ".")}

    top = {k: v for k, v in values.items() if "." not in k}
    try:
        return Settings(kafka=KafkaSettings(**section("kafka")), redis=RedisSettings(**section("redis")),
                        partitions={**DEFAULT_PARTITIONS, **section("partitions")},
                        record_bytes=section("record_bytes"), **top)
    except ConfigError as exc:  # re-raised naming where the offending value came from
        reason = str(exc).split(f"{exc.key}: ", 1)[-1]
        raise ConfigError(exc.key, reason, sources.get(exc.key, exc.source)) from None


def settings_from_env(env: Mapping[str, str] | None = None) -> Settings:
    """Settings from ``CHUNKSERVE_*`` variables over the file ``CHUNKSERVE_CONFIG`` names, as
    the CLI reads them (a producer written from the README's example ignored the file: its
    sessions went to the default prefix's topics, which no processor read); unset ones keep
    their defaults."""
    env = os.environ if env is None else env
    path = env.get(f"{ENV_PREFIX}CONFIG")
    return load_settings(Path(path) if path else None, env)


#: the roles whose processes `up` (and, for its workers, the provisioner) may start as a
#: Kafka principal of their own: CHUNKSERVE_<ROLE>_KAFKA_SASL_USERNAME / _PASSWORD
SASL_ROLES = ("dispatch", "detector", "control", "metrics", "provisioner", "worker")


def role_sasl_env(role: str) -> tuple[str, str]:
    """The variables holding ``role``'s own SASL user name and password."""
    return (f"{ENV_PREFIX}{role.upper()}_KAFKA_SASL_USERNAME", f"{ENV_PREFIX}{role.upper()}_KAFKA_SASL_PASSWORD")


def role_credentials(env: Mapping[str, str], role: str) -> tuple[str, str] | None:
    """``role``'s own SASL user and password from ``env``: both variables or neither (then
    it signs in as the process that starts it)."""
    names = role_sasl_env(role)
    user, password = (env.get(k) or None for k in names)
    if (user is None) != (password is None):
        given, missing = names if password is None else names[::-1]
        raise ConfigError(given, f"set {missing} with it (the {role} role's own Kafka principal)", "environment")
    return (user, password) if user and password else None


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment that gives a child process exactly ``settings`` (endpoints, transport
    security, topics, bounds), over ``base`` (default: this process's environment)."""
    env = dict(os.environ if base is None else base)
    for key in KEYS:
        section, _, name = key.rpartition(".")
        if section in ("kafka", "redis"):
            value = getattr(getattr(settings, section), name)
        elif section:
            value = getattr(settings, section).get(name)
        else:
            value = getattr(settings, name)
        if value is not None:
            env[env_var(key)] = str(value)
        else:  # unset here: the parent's variable for it must not reach the child
            env.pop(env_var(key), None)
    for own in (PARENT_PID_ENV, PROVISIONER_ENV):  # about this process, not about its children
        env.pop(own, None)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def env_number(env: Mapping[str, str], name: str, default: Any, *, positive: bool = False) -> Any:
    """A process setting read from the environment variable ``name`` (``default`` when unset
    or empty), of the type of ``default``: a finite number at least 0 (above 0 with
    ``positive``); else a ``ConfigError`` naming the variable."""
    raw = env.get(name)
    if not raw:
        return default
    kind = int if isinstance(default, int) and not isinstance(default, bool) else float
    try:
        value = kind(raw)
    except ValueError:
        raise ConfigError(name, f"not {'an integer' if kind is int else 'a number'}: {raw[:40]!r}",
                          "environment") from None
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ConfigError(name, f"must be {'above' if positive else 'at least'} 0, got {raw[:40]!r}", "environment")
    return value
