"""Command authenticity: an HMAC over every record on ``worker-commands`` and
``scaling-commands``, in two Kafka headers (``cs-kid``: key id, ``cs-mac``: the tag).

Keys come from the environment only: ``CHUNKSERVE_COMMAND_KEYS="kid1:HEX,kid2:HEX"``; the
first (or ``CHUNKSERVE_COMMAND_KEY_ID``) signs, every listed key verifies, so a new key is
rolled out by listing both, then signing with the new one, then dropping the old one. The
tag covers the logical topic and the encoded record, so a command cannot be replayed onto
another topic; replays of old commands on the same topic are refused by their generation
(workers) or decision id (provisioner).
"""

from __future__ import annotations

import hashlib
import hmac
import os
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from schemas.errors import ConfigError
from schemas.topics import SCALING_COMMANDS, WORKER_COMMANDS

__all__ = ["CommandKeys", "SIGNED_TOPICS", "KID_HEADER", "MAC_HEADER"]

SIGNED_TOPICS = frozenset({WORKER_COMMANDS, SCALING_COMMANDS})
KID_HEADER, MAC_HEADER = "cs-kid", "cs-mac"
_ENV_KEYS, _ENV_ACTIVE = "CHUNKSERVE_COMMAND_KEYS", "CHUNKSERVE_COMMAND_KEY_ID"


@dataclass(frozen=True)
class CommandKeys:
    """The verification keys by id and the id that signs (``None``: signing is off)."""

    keys: Mapping[str, bytes] = field(default_factory=dict, repr=False)
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
        keys: dict[str, bytes] = {}
        for n, item in enumerate(raw.split(","), start=1):
            kid, sep, secret = item.strip().partition(":")
            try:
                key = bytes.fromhex(secret)
            except ValueError:
                key = b""
            if not sep or not kid or len(key) < 16:
                raise ConfigError(_ENV_KEYS, f"entry {n}: expected KEY_ID:HEX with at least 16 "
                                  "bytes of key", "environment")
            if kid in keys:  # the last would win, and commands signed with the first be refused as forged
                raise ConfigError(_ENV_KEYS, f"entry {n}: key id {kid!r} is given twice", "environment")
            keys[kid] = key
        active = env.get(_ENV_ACTIVE) or next(iter(keys))
        if active not in keys:
            raise ConfigError(_ENV_ACTIVE, f"{active!r} is not one of the keys in {_ENV_KEYS}",
                              "environment")
        return cls(keys, active)

    def _tag(self, key: bytes, topic: str, value: bytes) -> bytes:
        return hmac.new(key, topic.encode() + b"\0" + value, hashlib.sha256).digest()

    def sign(self, topic: str, value: bytes) -> list[tuple[str, bytes]]:
        """Headers for a record of logical ``topic`` (none when signing is off or not needed)."""
        if not self.enabled or topic not in SIGNED_TOPICS:
            return []
        assert self.active is not None
        return [(KID_HEADER, self.active.encode()),
                (MAC_HEADER, self._tag(self.keys[self.active], topic, value))]

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
        if not hmac.compare_digest(mac, self._tag(key, topic, value or b"")):
            return "forged"
        return None
