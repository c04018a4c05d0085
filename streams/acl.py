"""The Redis ACL a chunkserve deployment needs: its own key namespace, and only the commands
the generation store runs (EVALSHA / SCRIPT LOAD, and inside its Lua scripts a few hash, set,
sorted-set and string commands: the sorted set is the recovery queue, the strings the leases);
on a Redis Cluster also the slot map and the replica count it reads to find its slot's master and to acknowledge fenced writes
(``CLUSTER SLOTS``, ``CLUSTER NODES``, ``ROLE``, ``WAIT``). Nothing else: no FLUSHALL, no
KEYS, no CONFIG, no other namespace's keys.
"""

from __future__ import annotations

__all__ = ["COMMANDS", "CLUSTER_COMMANDS", "acl_rules"]

COMMANDS = ("evalsha", "script|load", "ping", "hello",
            "hget", "hset", "hmget", "hdel", "hexists", "hgetall", "hkeys", "hincrby",
            "sadd", "srem", "sismember", "smembers", "zadd", "zrem", "zrangebyscore", "zcard",
            "del", "pexpire", "get", "set", "pttl")
CLUSTER_COMMANDS = ("cluster|slots", "cluster|nodes", "role", "wait")


def acl_rules(namespace: str, cluster: bool = False) -> list[str]:
    """``ACL SETUSER <user> on >password`` followed by these rules (``cluster``: for the
    store on a Redis Cluster, ``redis.cluster = on``)."""
    return ["resetkeys", f"~{{{namespace}}}:*", "resetchannels", "-@all",
            *(f"+{c}" for c in COMMANDS + (CLUSTER_COMMANDS if cluster else ()))]
