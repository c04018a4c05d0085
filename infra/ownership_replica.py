"""The protocol study's replicated store: a master, one asynchronous replica, and failover.

Every write lands on the master and reaches the replica in order, a drawn number of ticks
later. The master may die at a drawn tick, or in the middle of a drawn write; the replica
is promoted with whatever it had (the rest is lost) and the old master rejoins as a fresh
replica a few ticks later. With the acknowledgement (``redis.replica_acks``), a fenced write
(``streams.store_backends.FENCED_WRITES``) returns to its caller only once the replica holds
it and everything before it, as ``WAIT`` does; a write whose acknowledgement never came (the
master died first, or the replica lagged past the timeout) raises ``InfraError`` to its
caller, whether or not the write survives. Reads go to the master. A master without a
replica cannot fail over (Redis Cluster leaves the slot down instead), so a death drawn
then is passed over. Pure: no Redis, no clocks; the tick comes from the simulation.
"""

from __future__ import annotations

import copy
import random
from collections import deque
from typing import Any, Callable

from schemas.errors import InfraError
from streams.store_backends import FENCED_WRITES

__all__ = ["READS", "PlacementScripts", "ReplicatedScripts", "make_replica_plan"]

READS = frozenset({"session", "snap_read", "sessions_of", "load_view", "recovery_due"})


def make_replica_plan(rng: random.Random, ticks: int) -> dict[str, Any]:
    """Per write: ticks until the replica has it, and whether a fenced write's WAIT times out;
    the master deaths: (tick, dies mid-write?, that write reached the replica?); rejoin delays."""
    writes = [(rng.choice((0, 0, 0, 0, 1, 1, 2, 3)), rng.random() < 0.05) for _ in range(32)]
    deaths = sorted((rng.randint(1, ticks + 3), rng.random() < 0.5, rng.random() < 0.5)
                    for _ in range(1 if rng.random() < 0.7 else 2))
    return {"writes": writes, "deaths": deaths, "rejoin": [rng.randint(1, 3) for _ in range(2)]}


def _clone(scripts: Any) -> Any:
    """A full resync: the replica's copy of the master's keyspace (containers copied)."""
    twin = copy.copy(scripts)
    twin.data = {k: v.copy() if isinstance(v, (dict, set)) else v for k, v in scripts.data.items()}
    if hasattr(scripts, "ttl"):
        twin.ttl = dict(scripts.ttl)
    return twin


class PlacementScripts:
    """The baselines' store: one placement record and the last chunk a releaser recorded."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"placement": None, "progress": -1}

    def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        if name == "session":
            return self.data["placement"], self.data["progress"]
        self.data["placement" if name == "commit" else "progress"] = args[-1]
        return None


class ReplicatedScripts:
    """A scripts backend (``call(name, keys, args)``) over a master and its replica."""

    def __init__(self, master: Any, plan: dict[str, Any], ack: bool,
                 log: Callable[[str], None] = lambda text: None) -> None:
        self.master, self.replica = master, None  # set-up writes reach the master alone
        self.plan, self.ack, self.log = plan, ack, log
        self.started = False
        self.stream: deque[tuple[int, str, list[str], list[Any]]] = deque()  # (arrival tick, call)
        self.t = self.write_i = self.death_i = self.rejoin_i = 0
        self.rejoin_at: int | None = None
        self.mid_write: tuple[bool] | None = None  # armed: the master dies in the next write
        self.failovers = self.lost = self.unacked = 0

    def tick(self, t: int) -> None:
        """Start of tick ``t``: deliver what arrived, rejoin, and kill the master if drawn."""
        self.t = t
        if not self.started:
            self.replica, self.started = _clone(self.master), True  # in sync when the run starts
        self._deliver(lambda arrival: arrival < t)
        if self.rejoin_at is not None and t >= self.rejoin_at:
            self.replica, self.rejoin_at = _clone(self.master), None
            self.log("the old master rejoins as a replica (full resync)")
        deaths = self.plan["deaths"]
        while self.death_i < len(deaths) and deaths[self.death_i][0] <= t:
            _, mid_write, reached = deaths[self.death_i]
            self.death_i += 1
            if self.replica is None:
                continue
            if mid_write:
                self.mid_write = (reached,)
            else:
                self._failover()

    def _deliver(self, due: Callable[[int], bool]) -> None:
        while self.stream and due(self.stream[0][0]):
            _, name, keys, args = self.stream.popleft()
            self.replica.call(name, keys, args)

    def _failover(self, during: str = "") -> None:
        lost = [f"{c[1]}({','.join(str(a) for a in c[3][1:4] if a != '')})" for c in self.stream]
        self.failovers += 1
        self.lost += len(lost)
        self.master, self.replica, self.stream = self.replica, None, deque()
        self.rejoin_at = self.t + self.plan["rejoin"][min(self.rejoin_i, len(self.plan["rejoin"]) - 1)]
        self.rejoin_i += 1
        self.mid_write = None
        self.log(f"MASTER DIES{' during ' + during if during else ''}: the replica is promoted; "
                 f"lost writes: {', '.join(lost) or 'none'}")

    def call(self, name: str, keys: list[str], args: list[Any]) -> Any:
        reply = self.master.call(name, keys, args)
        if name in READS or self.replica is None:
            return reply
        delay, times_out = self.plan["writes"][self.write_i % len(self.plan["writes"])]
        self.write_i += 1
        arrival = max(self.stream[-1][0] if self.stream else 0, self.t + delay)
        self.stream.append((arrival, name, keys, args))
        fenced = self.ack and name in FENCED_WRITES
        if self.mid_write is not None:
            if self.mid_write[0]:
                self._deliver(lambda arrival: True)
            self._failover(name)
            if fenced:
                return self._unacked(name, "the master died before the replica acknowledged it")
            return reply
        if fenced:
            if times_out:
                return self._unacked(name, "the replica lagged past the WAIT timeout")
            self._deliver(lambda arrival: True)
        return reply

    def _unacked(self, name: str, why: str) -> Any:
        self.unacked += 1
        self.log(f"{name} not acknowledged: {why}")
        raise InfraError(f"{name}: {why}")
