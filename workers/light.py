"""A light worker process: the real runtime driving ``NullModel`` (no torch).

``python -m workers.light --worker-id W --capacity N [--chunk-interval S]`` reads its
endpoints from ``CHUNKSERVE_*`` like ``chunkserve worker``. The control-plane benchmark runs
these so it measures commands, claims and inputs rather than chunk traffic: each session
runs one chunk on claim, then one per ``--chunk-interval`` (default one hour).
"""

from __future__ import annotations

import argparse
import asyncio
import logging

from streams.config import Settings

from .null_model import NullModel
from .runtime import Worker, WorkerConfig, serve

__all__ = ["LightWorker", "main"]


class LightWorker(Worker):
    """``Worker`` whose command poll waits until the next chunk is due (at most 50 ms).

    The stock loop polls with a 1 ms timeout whenever any session executes, which spins a
    core per worker when chunks are an hour apart; this one blocks in the poll instead
    (the poll still returns as soon as a command arrives).
    """

    async def run(self, stop: asyncio.Event) -> None:
        await self.start()
        next_beat = 0.0
        try:
            while not stop.is_set():
                now = self.monotonic()
                due = min((s.next_due for s in self.sessions.values() if s.executing), default=now + 1)
                wait_ms = int(max(1.0, min(50.0, (due - now) * 1000)))
                await self.poll_commands(timeout_ms=wait_ms)
                if due <= self.monotonic():
                    await self.tick()
                if self.monotonic() >= next_beat:
                    await self.heartbeat()
                    next_beat = self.monotonic() + self.config.heartbeat_s
        finally:
            await self.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.light", description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--chunk-interval", type=float, default=3600.0)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = WorkerConfig(worker_id=args.worker_id, capacity=args.capacity,
                       chunk_interval_s=args.chunk_interval, heartbeat_s=args.heartbeat,
                       snapshot_every=0)

    serve(settings, cfg, NullModel(), worker_cls=LightWorker)


if __name__ == "__main__":
    main()
