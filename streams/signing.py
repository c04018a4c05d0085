"""Command authenticity: a tag over every record on ``worker-commands`` and
``scaling-commands``, in two Kafka headers (``cs-kid``: key id, ``cs-mac``: the tag).

Keys come from the environment only: ``CHUNKSERVE_COMMAND_KEYS="kid1:HEX,kid2:HEX"``; the
first (or ``CHUNKSERVE_COMMAND_KEY_ID``) signs, every listed key verifies, so a new key is
rolled out by listing both, then signing with the new one, then dropping the old one. The
tag covers the logical topic and the encoded record, so a command cannot be replayed onto
another topic; replays of old commands on the same topic are refused by their generation
(workers) or decision id (provisioner).

A key is an HMAC-SHA256 key (``kid:HEX``, at least 16 bytes: every process that verifies
could sign too) or an Ed25519 key pair: ``kid:ed25519:HEX`` (the 32-byte private key, for
the processes that sign) or ``kid:ed25519-pub:HEX`` (its public key, which verifies and
cannot sign). :meth:`CommandKeys.verify_only` gives the second form of every Ed25519 key, for
the processes that only read commands (workers, the provisioner): a worker that is taken
over then holds nothing that signs.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from schemas.codec import TYPE_HEADER
from schemas.errors import ConfigError
from schemas.records import CommandRejected
from schemas.topics import SCALING_COMMANDS, WORKER_COMMANDS, WORKER_EVENTS

__all__ = ["CommandKeys", "EventKeys", "Key", "new_key", "COMMAND_KEYS_ENV", "COMMAND_SIGNERS", "SIGNED_TOPICS",
           "EVENT_KEYS_ENV", "EVENT_KEY_HOLDERS", "EVENT_REFUSALS", "WORKER_EVENT_KEY_ENV", "KID_HEADER", "MAC_HEADER", "record_headers", "speaks_for", "worker_env"]

SIGNED_TOPICS = frozenset({WORKER_COMMANDS, SCALING_COMMANDS})
KID_HEADER, MAC_HEADER = "cs-kid", "cs-mac"
_ENV_KEYS, _ENV_ACTIVE = "CHUNKSERVE_COMMAND_KEYS", "CHUNKSERVE_COMMAND_KEY_ID"
COMMAND_KEYS_ENV = _ENV_KEYS
#: the processes that write commands (and so hold the keys that sign): the rest of a fleet
#: (workers, the provisioner, detector, metrics) is handed only what verifies
COMMAND_SIGNERS = frozenset({"dispatch", "control"})


@dataclass(frozen=True)
class Key:
    """One listed key: ``hmac`` (its secret), ``ed25519`` (a private key) or ``ed25519-pub``."""

    kind: str
    raw: bytes = field(repr=False)

    def tag(self, message: bytes) -> bytes:
        if self.kind == "hmac":
            return hmac.new(self.raw, message, hashlib.sha256).digest()
        if self.kind == "ed25519":
            return _private(self.raw).sign(message)
        raise ConfigError(_ENV_ACTIVE, "names an ed25519-pub key, which verifies and cannot sign: a process "
                          "that writes commands needs the private key (kid:ed25519:HEX)", "environment")

    def verifies(self, message: bytes, tag: bytes) -> bool:
        if self.kind == "hmac":
            return hmac.compare_digest(tag, self.tag(message))
        from cryptography.exceptions import InvalidSignature

        try:
            _public(self.public()).verify(tag, message)
            return True
        except InvalidSignature:
            return False

    def public(self) -> bytes:
        """An Ed25519 key's public key."""
        return self.raw if self.kind == "ed25519-pub" else _public_of(self.raw)


@functools.lru_cache(maxsize=64)
def _private(raw: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.from_private_bytes(raw)


@functools.lru_cache(maxsize=64)
def _public_of(private: bytes) -> bytes:
    """A private key's public key (derived once per key, not at every command verified)."""
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    return _private(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


@functools.lru_cache(maxsize=64)
def _public(raw: bytes) -> Any:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return Ed25519PublicKey.from_public_bytes(raw)


def _key(n: int, kind: str, secret: str) -> Key:
    try:
        raw = bytes.fromhex(secret)
    except ValueError:
        raw = b""
    if kind == "hmac" and len(raw) >= 16 or kind in ("ed25519", "ed25519-pub") and len(raw) == 32:
        try:
            if kind != "hmac":
                (_public if kind == "ed25519-pub" else _private)(raw)
        except ValueError:  # not a point of the curve
            raw = b""
        else:
            return Key(kind, raw)
    raise ConfigError(_ENV_KEYS, f"entry {n}: expected KEY_ID:HEX with at least 16 bytes of key, or "
                      "KEY_ID:ed25519:HEX / KEY_ID:ed25519-pub:HEX with 32 bytes", "environment")


@dataclass(frozen=True)
class CommandKeys:
    """The verification keys by id and the id that signs (``None``: signing is off)."""

    keys: Mapping[str, Key] = field(default_factory=dict, repr=False)
    active: str | None = None

    @property
    def enabled(self) -> bool:
        return self.active is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "CommandKeys":
        env = os.environ if env is None else env
        if _ENV_KEYS not in env:
            return cls()
        raw = env[_ENV_KEYS].strip()
        if not raw:  # a template whose secret did not arrive: refused, not signing turned off
            raise ConfigError(_ENV_KEYS, "set but empty: give KEY_ID:HEX entries, or unset it to turn "
                              "signing off", "environment")
        keys: dict[str, Key] = {}
        for n, item in enumerate(raw.split(","), start=1):
            kid, sep, rest = item.strip().partition(":")
            kind, colon, secret = rest.partition(":")
            if not colon:
                kind, secret = "hmac", rest
            elif kind not in ("ed25519", "ed25519-pub"):
                kind = "?"
            if not sep or not kid:
                raise ConfigError(_ENV_KEYS, f"entry {n}: expected KEY_ID:HEX with at least 16 "
                                  "bytes of key", "environment")
            if kid in keys:  # the last would win, and commands signed with the first be refused as forged
                raise ConfigError(_ENV_KEYS, f"entry {n}: key id {kid!r} is given twice", "environment")
            keys[kid] = _key(n, kind, secret)
        active = env.get(_ENV_ACTIVE) or next(iter(keys))
        if active not in keys:
            raise ConfigError(_ENV_ACTIVE, f"{active!r} is not one of the keys in {_ENV_KEYS}",
                              "environment")
        return cls(keys, active)

    def verify_only(self) -> str | None:
        """The ``CHUNKSERVE_COMMAND_KEYS`` value for a process that only reads commands: every
        Ed25519 key as its public key (HMAC keys as they are: they cannot be split). None
        when signing is off."""
        if not self.keys:
            return None
        return ",".join(f"{kid}:{k.raw.hex()}" if k.kind == "hmac" else f"{kid}:ed25519-pub:{k.public().hex()}"
                        for kid, k in self.keys.items())

    @staticmethod
    def _message(topic: str, value: bytes) -> bytes:
        return topic.encode() + b"\0" + value

    def sign(self, topic: str, value: bytes) -> list[tuple[str, bytes]]:
        """Headers for a record of logical ``topic`` (none when signing is off or not needed)."""
        if not self.enabled or topic not in SIGNED_TOPICS:
            return []
        assert self.active is not None
        return [(KID_HEADER, self.active.encode()), (MAC_HEADER, self.keys[self.active].tag(self._message(topic, value)))]

    def verify(self, topic: str, value: bytes | None,
               headers: Iterable[tuple[str, bytes]] | None) -> str | None:
        """None when the record may be taken; else why not: unsigned, unknown_key, forged."""
        if not self.keys or topic not in SIGNED_TOPICS:
            return None
        if (signed := _signature(headers)) is None:
            return "unsigned"
        key = self.keys.get(signed[0])
        if key is None:
            return "unknown_key"
        if not key.verifies(self._message(topic, value or b""), signed[1]):
            return "forged"
        return None


def _signature(headers: Iterable[tuple[str, bytes]] | None) -> tuple[str, bytes] | None:
    """The key id and tag a record's headers carry (None: unsigned)."""
    found = dict(headers or ())
    kid, mac = found.get(KID_HEADER), found.get(MAC_HEADER)
    return (kid.decode(errors="replace"), mac) if kid and mac else None


def new_key(kid: str, kind: str = "ed25519") -> tuple[str, str]:
    """A new key: its entry for the processes that sign, and for those that only verify (the
    same for HMAC)."""
    import secrets

    if kind == "hmac":
        entry = f"{kid}:{secrets.token_hex(32)}"
        return entry, entry
    key = Key("ed25519", secrets.token_bytes(32))
    return f"{kid}:ed25519:{key.raw.hex()}", f"{kid}:ed25519-pub:{key.public().hex()}"


EVENT_KEYS_ENV = "CHUNKSERVE_EVENT_KEYS"
WORKER_EVENT_KEY_ENV = "CHUNKSERVE_WORKER_EVENT_KEY"
_ENV_EVENT_ACTIVE = "CHUNKSERVE_EVENT_KEY_ID"
#: the roles of a fleet that hold the masters: they check the records they act on, or write
#: records about any worker (the rest, detector included, are handed none; a worker its own key)
EVENT_KEY_HOLDERS = frozenset({"dispatch", "control", "metrics", "provisioner"})


@dataclass(frozen=True)
class EventKeys:
    """Who wrote a ``worker-events`` record: a tag in the ``cs-kid`` / ``cs-mac`` headers with
    the key of the worker the record is keyed by, ``HMAC-SHA256(master, "worker-events\0" +
    worker id)``. The processes that read the topic and act on it (dispatch, control, metrics)
    and those that write it for any worker (control's declarations, the provisioner) hold the
    masters (``CHUNKSERVE_EVENT_KEYS="kid:HEX,..."``, at least 16 bytes each; the first, or
    ``CHUNKSERVE_EVENT_KEY_ID``, signs); a worker holds only its own derived key
    (``CHUNKSERVE_WORKER_EVENT_KEY="kid:HEX"``), which the provisioner hands it: a worker taken
    over can sign nothing about another worker (an outside run's worker principal sent a
    ``WorkerDown`` for a healthy worker, whose session was taken from it). Off (no key in the
    environment), records are neither signed nor checked."""

    masters: Mapping[str, bytes] = field(default_factory=dict, repr=False)
    active: str | None = None
    own: tuple[str, bytes] | None = field(default=None, repr=False)  # a worker's (kid, derived key)

    @property
    def checks(self) -> bool:
        """Whether records read are checked (this process holds the masters)."""
        return bool(self.masters)

    @property
    def enabled(self) -> bool:
        return bool(self.masters) or self.own is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "EventKeys":
        env = os.environ if env is None else env
        masters: dict[str, bytes] = {}
        for var in (EVENT_KEYS_ENV, WORKER_EVENT_KEY_ENV):
            if var in env and not env[var].strip():  # a template whose secret did not arrive
                raise ConfigError(var, "set but empty: give KEY_ID:HEX, or unset it to turn worker-event "
                                  "signing off", "environment")
        if EVENT_KEYS_ENV in env:
            for n, item in enumerate(env[EVENT_KEYS_ENV].strip().split(","), start=1):
                kid, raw = _hmac_entry(EVENT_KEYS_ENV, n, item)
                if kid in masters:
                    raise ConfigError(EVENT_KEYS_ENV, f"entry {n}: key id {kid!r} is given twice", "environment")
                masters[kid] = raw
        own = _hmac_entry(WORKER_EVENT_KEY_ENV, 1, env[WORKER_EVENT_KEY_ENV].strip()) \
            if WORKER_EVENT_KEY_ENV in env else None
        active = (env.get(_ENV_EVENT_ACTIVE) or next(iter(masters))) if masters else None
        if active is not None and active not in masters:
            raise ConfigError(_ENV_EVENT_ACTIVE, f"{active!r} is not one of the keys in {EVENT_KEYS_ENV}", "environment")
        return cls(masters, active, own)

    def for_worker(self, worker_id: str) -> str | None:
        """The ``CHUNKSERVE_WORKER_EVENT_KEY`` value of ``worker_id`` (None without masters)."""
        if self.active is None:
            return None
        return f"{self.active}:{_derived(self.masters[self.active], worker_id.encode()).hex()}"

    def sign(self, topic: str, key: bytes | None, value: bytes) -> list[tuple[str, bytes]]:
        """Headers for a record of logical ``topic`` keyed by ``key`` (none off ``worker-events``)."""
        if topic != WORKER_EVENTS or not self.enabled:
            return []
        if self.own is not None and not self.masters:  # a worker: its records are keyed by its id
            kid, secret = self.own
        else:
            assert self.active is not None
            kid, secret = self.active, _derived(self.masters[self.active], key or b"")
        return [(KID_HEADER, kid.encode()), (MAC_HEADER, _tag(secret, value))]

    def check(self, topic: str, rec: Any, key: bytes | None, value: bytes | None,
              headers: Iterable[tuple[str, bytes]] | None) -> str | None:
        """None when the decoded record ``rec`` may be acted on; else why not (a key of
        :data:`EVENT_REFUSALS`): its signature (:meth:`verify`), or a worker it speaks for other
        than the one it is keyed by and signed as (an outside run's worker, signing with its own
        key a record keyed by its own id, sent a ``WorkerDown`` and a ``Frozen`` naming another
        worker, and dispatch took that worker's sessions)."""
        if topic != WORKER_EVENTS or not self.masters:
            return None
        why = self.verify(topic, key, value, headers)
        if why is None and any(w.encode() != key for w in speaks_for(rec)):
            return "another_worker"
        return why

    def verify(self, topic: str, key: bytes | None, value: bytes | None,
               headers: Iterable[tuple[str, bytes]] | None) -> str | None:
        """None when the record's bytes are signed with the key of the worker it is keyed by;
        else why not: unsigned, unknown_key, forged (the tag is not that worker's key's: made
        up, or made with another worker's key). What it says is :meth:`check`'s."""
        if topic != WORKER_EVENTS or not self.masters:
            return None
        if (signed := _signature(headers)) is None:
            return "unsigned"
        master = self.masters.get(signed[0])
        if master is None:
            return "unknown_key"
        if not hmac.compare_digest(signed[1], _tag(_derived(master, key or b""), value or b"")):
            return "forged"
        return None


#: why a worker event is not acted on, as dead letters say it
EVENT_REFUSALS = {
    "unsigned": "a worker event with no signature (this fleet signs them: CHUNKSERVE_EVENT_KEYS)",
    "unknown_key": "a worker event signed with a key id this process does not know (cs-kid)",
    "forged": "a worker event whose signature does not verify under the key of the worker it is keyed by "
              "(made up, or made with another worker's key)",
    "another_worker": "a worker event that speaks for another worker than the one it is keyed by and signed as",
}


def speaks_for(rec: Any) -> set[str]:
    """The workers a worker event speaks for: its ``worker_id`` and, but on a
    ``CommandRejected`` (whose generation is the refused command's), its generation's worker."""
    who = {rec.worker_id}
    gen = getattr(rec, "generation", None)
    if gen is not None and not isinstance(rec, CommandRejected):
        who.add(gen.worker_id)
    return who


def _hmac_entry(var: str, n: int, item: str) -> tuple[str, bytes]:
    kid, sep, secret = item.strip().partition(":")
    try:
        raw = bytes.fromhex(secret)
    except ValueError:
        raw = b""
    if not sep or not kid or len(raw) < 16:
        raise ConfigError(var, f"entry {n}: expected KEY_ID:HEX with at least 16 bytes of key", "environment")
    return kid, raw


@functools.lru_cache(maxsize=4096)
def _derived(master: bytes, worker_key: bytes) -> bytes:
    """A worker's key (once per worker, not at every event)."""
    return hmac.new(master, WORKER_EVENTS.encode() + b"\0" + worker_key, hashlib.sha256).digest()


def _tag(secret: bytes, value: bytes) -> bytes:
    return hmac.new(secret, WORKER_EVENTS.encode() + b"\0" + value, hashlib.sha256).digest()


def worker_env(env: dict[str, str], worker_id: str) -> None:
    """Hand a worker's environment its own event key in place of the masters (a worker that
    starts with the masters could sign for every other worker)."""
    own = EventKeys.from_env(env).for_worker(worker_id)
    env.pop(EVENT_KEYS_ENV, None)
    env.pop(_ENV_EVENT_ACTIVE, None)
    if own is not None:
        env[WORKER_EVENT_KEY_ENV] = own


def record_headers(tag: str, topic: str, key: bytes | None, value: bytes, commands: CommandKeys,
                   events: EventKeys) -> list[tuple[str, bytes]]:
    """Every header a record of logical ``topic`` carries: its type tag, and the signature its
    topic takes (a command's, a worker event's), whichever producer sends it."""
    return [(TYPE_HEADER, tag.encode()), *commands.sign(topic, value), *events.sign(topic, key, value)]
