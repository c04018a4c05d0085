"""The Redis ACL a chunkserve deployment needs: its own key namespace, and only the commands
the generation store runs (EVALSHA / SCRIPT LOAD, and inside its Lua scripts a few hash and
set commands). Nothing else: no FLUSHALL, no KEYS, no CONFIG, no other namespace's keys.
"""

from __future__ import annotations

__all__ = ["COMMANDS", "acl_rules"]

COMMANDS = ("evalsha", "script|load", "ping", "hello",
            "hget", "hset", "hmget", "hdel", "hexists", "hgetall", "hkeys", "hincrby",
            "sadd", "srem", "sismember", "smembers", "del", "pexpire")


def acl_rules(namespace: str) -> list[str]:
    """``ACL SETUSER <user> on >password`` followed by these rules."""
    return ["resetkeys", f"~{{{namespace}}}:*", "resetchannels", "-@all",
            *(f"+{c}" for c in COMMANDS)]
