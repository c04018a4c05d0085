"""The worker's outgoing events: handed to the producer as they are made, acknowledged per batch."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from schemas.records import Record

__all__ = ["Outbox"]

log = logging.getLogger(__name__)


class Outbox:
    """Events of one batch of commands go out together (in order per partition, but for one
    sent again after the broker gave up on it: it goes after those taken since) and
    ``acknowledged`` waits once for all of them."""

    def __init__(self, producer: Any, name: str) -> None:
        self.producer, self.name = producer, name
        self._unacked: list[tuple[Record, Any]] = []

    async def send(self, rec: Record) -> None:
        """Hand ``rec`` to the producer without waiting for the broker."""
        self._unacked.append((rec, await self.producer.send(rec, wait=False)))

    async def acknowledged(self, retry_s: float = 0.5) -> None:
        """Wait until every event handed over so far is acknowledged. A send the producer
        gave up on (the broker was away longer than it retries) is sent again, in order,
        until the broker takes it: a broker outage stalls the worker, never kills it."""
        from aiokafka.errors import KafkaError

        pending, self._unacked = self._unacked, []
        while pending:
            results = await asyncio.gather(*(fut for _, fut in pending), return_exceptions=True)
            errors = [res for res in results if isinstance(res, BaseException)]
            for err in errors:
                if not isinstance(err, KafkaError):
                    raise err
            failed = [rec for (rec, _), res in zip(pending, results) if isinstance(res, BaseException)]
            if failed:
                log.warning("%s: %d events not acknowledged (%r); sending them again",
                            self.name, len(failed), errors[0])
                await asyncio.sleep(retry_s)
            pending = [(rec, await self.producer.send(rec, wait=False)) for rec in failed]
