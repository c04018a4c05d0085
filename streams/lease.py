"""One live holder at a time for a name in the store's namespace (``worker:<id>``: a worker id
given to two processes; ``metrics:<topic prefix>``: a second metrics processor).

A holder takes the lease with a token naming it (host, pid and a random part) and refreshes it
well within its time; one that dies without a clean stop stops refreshing, so its lease
expires and a successor takes it then. Each check-and-change is one script
(``acquire_lease.lua``, ``release_lease.lua``), the key beside the namespace's others.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from typing import Any, Awaitable, Callable

from schemas.errors import InfraError

from .store_records import LeaseAnswer, LeaseState

__all__ = ["Lease", "LEASE_MARGIN_S", "RETRY_S", "PROCESSOR_LEASE_S", "holder_token", "holder_of"]

log = logging.getLogger(__name__)

LEASE_MARGIN_S = 1.0  # waited past a holder's time before its lease counts as live
RETRY_S = 0.25  # between tries of a lease another holds
PROCESSOR_LEASE_S = 5.0  # a processor (or `up`) run alone per topic prefix frees its place this long after a kill


def holder_token() -> str:
    """``host:pid:random``: whose the lease is, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def holder_of(token: str) -> str:
    """The ``host:pid`` of a token (the token itself when it has no random part)."""
    return token.rsplit(":", 1)[0] if token.count(":") >= 2 else token


class Lease:
    """This process's hold on ``name`` in ``store`` (a ``GenerationStore``): taken at start,
    refreshed on a timer, released at a clean stop."""

    def __init__(self, store: Any, name: str, ttl_s: float, *, token: str | None = None,
                 monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
        self.store, self.name, self.ttl_s = store, name, ttl_s
        self.token = token or holder_token()
        self.monotonic, self.sleep = monotonic, sleep

    @property
    def ttl_ms(self) -> int:
        return max(1, round(self.ttl_s * 1000))

    async def refresh(self) -> LeaseAnswer:
        """One try: taken or refreshed (its time set again), or who holds it."""
        return await self.store.acquire_lease(self.name, self.token, self.ttl_ms)

    async def take(self) -> LeaseAnswer:
        """Take the lease, trying every ``RETRY_S`` while another holds it, for as long as a
        holder that died could still hold it (its time left, at least ours, and
        ``LEASE_MARGIN_S``). The last answer: HELD when the holder stayed live."""
        answer = await self.refresh()
        if answer.ours:
            return answer
        deadline = self.monotonic() + max(self.ttl_s, answer.remaining_ms / 1000) + LEASE_MARGIN_S
        log.info("lease %s is held by %s; waiting up to %.1f s in case it stopped without a clean shutdown",
                 self.name, holder_of(answer.holder), deadline - self.monotonic())
        while not answer.ours and self.monotonic() < deadline:
            await self.sleep(RETRY_S)
            answer = await self.refresh()
        return answer

    async def keep(self, stop: asyncio.Event, every_s: float, outage: Any = None) -> LeaseAnswer | None:
        """Refresh every ``every_s`` until ``stop`` is set (None) or another holder has the
        lease (its answer: this process could not refresh for a whole lease time). A lease
        found gone (expired, Redis restarted) is taken again; a failed refresh is tried again
        at the next one. With ``outage`` (``failed(exc)``, ``answered()``: a serving process's
        ``workers.runtime.StoreOutage``), a store that does not answer is told there, one
        warning for a whole outage rather than one a beat."""
        while True:
            try:
                await asyncio.wait_for(stop.wait(), every_s)
                return None
            except asyncio.TimeoutError:
                pass
            try:
                answer = await self.refresh()
            except Exception as exc:  # noqa: BLE001 - Redis away or refusing: tried again at the next one
                if outage is not None and isinstance(exc, InfraError):
                    outage.failed(exc)
                else:
                    log.warning("lease %s: refresh failed, trying again in %.1f s: %s", self.name, every_s, exc)
                continue
            if outage is not None:
                outage.answered()
            if answer.state is LeaseState.HELD:
                return answer
            if answer.state is LeaseState.ACQUIRED:
                log.warning("lease %s had expired (Redis restarted, or out of reach for %.1f s): taken again",
                            self.name, self.ttl_s)

    async def release(self) -> bool:
        """Free the lease while this token holds it; Redis away: it expires by itself."""
        try:
            return await self.store.release_lease(self.name, self.token)
        except Exception as exc:  # noqa: BLE001 - a stop goes on; the lease runs out within its time
            log.warning("lease %s: not released (%s); it expires within %.1f s", self.name, exc, self.ttl_s)
            return False
