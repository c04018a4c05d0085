"""A light worker process: the real runtime driving ``NullModel`` (no torch).

``python -m workers.light --worker-id W --capacity N [--chunk-interval S]`` reads its
endpoints from ``CHUNKSERVE_*`` like ``chunkserve worker``. The control-plane benchmark runs
these so it measures commands, claims and inputs rather than chunk traffic: each session
runs one chunk on claim, then one per ``--chunk-interval`` (default one hour).
"""

from __future__ import annotations

import argparse
import logging

from streams.config_file import settings_from_env

from .null_model import NullModel
from .runtime import WorkerConfig, serve

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.light", description=__doc__)
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--capacity", type=int, default=8)
    parser.add_argument("--chunk-interval", type=float, default=3600.0)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    args = parser.parse_args(argv)
    settings = settings_from_env()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cfg = WorkerConfig(worker_id=args.worker_id, capacity=args.capacity,
                       chunk_interval_s=args.chunk_interval, heartbeat_s=args.heartbeat,
                       snapshot_every=0)

    serve(settings, cfg, NullModel())


if __name__ == "__main__":
    main()
