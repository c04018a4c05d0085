"""Broker faults for the chaos run: leader failover and a full restart, on the real cluster.

*Failover* (three brokers or more): SIGKILL the node that leads the most partitions of
``session-inputs`` and ``worker-commands``, restart it on its folder later. *Full restart*:
SIGKILL every node, start them again on the same folders. Kills and restarts run in a thread
(they block) while the run keeps serving; each fault records when it began and when the
cluster served again, so the audit can say how long sessions went unserved around it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from schemas.topics import SESSION_INPUTS, WORKER_COMMANDS
from streams.config import Settings
from streams.topics import TopicCatalogue

__all__ = ["KINDS", "BrokerFault", "plan", "leader_counts", "busiest_leader", "run_broker_faults", "unserved_s"]


@dataclass
class BrokerFault:
    """One fault: its kind, the nodes it killed, wall-clock start and end (cluster back)."""

    kind: str  # "leader_kill" or "full_restart"
    nodes: list[int]
    start: float
    end: float | None = None
    restart_s: float | None = None  # from the restart call to every node serving
    extra: dict[str, Any] = field(default_factory=dict)


def busiest_leader(counts: dict[int, int]) -> int:
    """The node leading the most partitions (the lowest id on a tie)."""
    return max(sorted(counts), key=lambda n: counts[n])


async def leader_counts(settings: Settings,
                        topics: tuple[str, ...] = (SESSION_INPUTS, WORKER_COMMANDS)) -> dict[int, int]:
    """How many partitions of ``topics`` each node leads (the admin client's describe_topics)."""
    from aiokafka.admin import AIOKafkaAdminClient

    catalogue = TopicCatalogue.from_settings(settings)
    admin = AIOKafkaAdminClient(**settings.kafka.client_kwargs())
    await admin.start()
    try:
        described = await admin.describe_topics([catalogue.name(t) for t in topics])
    finally:
        await admin.close()
    counts: dict[int, int] = {}
    for topic in described:
        for p in topic["partitions"]:
            if p["leader"] >= 0:
                counts[p["leader"]] = counts.get(p["leader"], 0) + 1
    return counts


KINDS = ("leader_kill", "full_restart")


def plan(brokers: int, duration_s: float, kinds: tuple[str, ...] = KINDS) -> list[tuple[float, str]]:
    """``(seconds into the run, fault)``: a failover where there are three nodes, then a
    full restart (of those among ``kinds``)."""
    steps = [(0.25 * duration_s, "leader_kill")] if brokers >= 3 and "leader_kill" in kinds else []
    return steps + ([(0.6 * duration_s, "full_restart")] if "full_restart" in kinds else [])


async def run_broker_faults(settings: Settings, broker: Any, duration_s: float, t0: float,
                            faults: list[BrokerFault], kinds: tuple[str, ...] = KINDS,
                            down_s: float = 8.0, outage_s: float = 0.0, settle_s: float = 5.0,
                            progress: Callable[[str], None] = lambda _m: None) -> None:
    """Carry out ``plan`` against ``broker`` (an ``EmbeddedKafka``) from monotonic ``t0``,
    appending each fault to ``faults`` as it starts. A node killed alone stays down
    ``down_s``, all of them ``outage_s``; every fault, the last included, is followed by
    ``settle_s`` of service."""
    settled = t0
    for at, kind in plan(broker.brokers, duration_s, kinds):
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic(), settled - time.monotonic()))
        if kind == "leader_kill":
            counts = await leader_counts(settings)
            node = busiest_leader(counts)
            fault = BrokerFault(kind, [node], time.time(), extra={"led_partitions": counts.get(node, 0)})
            faults.append(fault)
            progress(f"SIGKILL broker {node} (leads {counts.get(node, 0)} partitions)")
            await asyncio.to_thread(broker.kill, node)
            await asyncio.sleep(down_s)
            progress(f"restarting broker {node}")
            began = time.monotonic()
            await asyncio.to_thread(broker.restart, node)
        else:
            fault = BrokerFault(kind, [n.node_id for n in broker.nodes], time.time())
            faults.append(fault)
            progress("SIGKILL every broker")
            await asyncio.to_thread(broker.kill_all)
            await asyncio.sleep(outage_s)
            progress("restarting every broker")
            began = time.monotonic()
            await asyncio.to_thread(broker.restart_all)
        fault.restart_s = round(time.monotonic() - began, 2)
        fault.end = time.time()
        settled = time.monotonic() + settle_s
        progress(f"{kind}: cluster back after {fault.restart_s} s")
    await asyncio.sleep(max(0.0, settled - time.monotonic()))


def unserved_s(chunk_times: dict[str, list[float]], start: float, end: float,
               lead_s: float = 1.0) -> float:
    """The longest time any session went without a released chunk, counting the gaps that
    began during a fault (from ``lead_s`` before ``start``, its last chunk before the kill,
    to ``end``, when the cluster was back)."""
    worst = 0.0
    for ts in chunk_times.values():
        ts = sorted(ts)
        for a, b in zip(ts, ts[1:]):
            if start - lead_s <= a < end:
                worst = max(worst, b - a)
    return round(worst, 3)
