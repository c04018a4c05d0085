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

from schemas.errors import ConfigError
from schemas.topics import SCALING_COMMANDS, WORKER_COMMANDS

__all__ = ["CommandKeys", "Key", "new_key", "COMMAND_KEYS_ENV", "COMMAND_SIGNERS", "SIGNED_TOPICS", "KID_HEADER", "MAC_HEADER"]

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
        found = dict(headers or ())
        kid, mac = found.get(KID_HEADER), found.get(MAC_HEADER)
        if not kid or not mac:
            return "unsigned"
        key = self.keys.get(kid.decode(errors="replace"))
        if key is None:
            return "unknown_key"
        if not key.verifies(self._message(topic, value or b""), mac):
            return "forged"
        return None


def new_key(kid: str, kind: str = "ed25519") -> tuple[str, str]:
    """A new key: its entry for the processes that sign, and for those that only verify (the
    same for HMAC)."""
    import secrets

    if kind == "hmac":
        entry = f"{kid}:{secrets.token_hex(32)}"
        return entry, entry
    key = Key("ed25519", secrets.token_bytes(32))
    return f"{kid}:ed25519:{key.raw.hex()}", f"{kid}:ed25519-pub:{key.public().hex()}"
