"""How long-running commands log: plain text, or one JSON object a line (``--log-format
json``, or ``CHUNKSERVE_LOG_FORMAT=json`` which the children of ``up`` and of the
provisioner inherit); never colours or terminal control codes, so a log file holds what
was said. JSON lines come from python-json-logger, with the fields ``ts``, ``level``,
``logger``, ``pid``, ``message`` and whatever a record adds with ``extra=``.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

__all__ = ["FORMATS", "logging_config", "Repeats"]

FORMATS = ("text", "json")


def logging_config(log_format: str, level: str = "INFO") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` document: one handler on stderr for the root logger."""
    if log_format not in FORMATS:
        raise ValueError(f"log format {log_format!r}: choose from {', '.join(FORMATS)}")
    formatter: dict[str, Any] = (
        {"()": "pythonjsonlogger.json.JsonFormatter",
         "fmt": "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s",
         "rename_fields": {"asctime": "ts", "levelname": "level", "name": "logger", "process": "pid"}}
        if log_format == "json" else {"format": "%(asctime)s %(name)s %(levelname)s %(message)s"})
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": formatter},
        "filters": {"repeats": {"()": "infra.logs.Repeats"}},
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "default",
                                 "stream": "ext://sys.stderr", "filters": ["repeats"]}},
        "root": {"level": level.upper(), "handlers": ["default"]},
    }


class Repeats(logging.Filter):
    """Lets a message through once per ``window_s`` (the same logger, level and text): a
    client retrying a broker that is down said `Unable connect to node` about 40 times a
    second (796 lines in an outside run's 20 s outage, over `watch`'s table). The first after
    a quiet spell says how many like it were held back."""

    def __init__(self, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.window_s, self.clock = window_s, clock
        self.seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # -> (last shown, held back since)

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, record.getMessage())
        now = self.clock()
        shown, held = self.seen.get(key, (float("-inf"), 0))
        if now - shown < self.window_s:
            self.seen[key] = (shown, held + 1)
            return False
        if len(self.seen) > 4096:  # a bounded memory: the oldest go first
            for old in sorted(self.seen, key=lambda k: self.seen[k][0])[:1024]:
                del self.seen[old]
        self.seen[key] = (now, 0)
        if held:
            record.msg, record.args = f"{record.getMessage()} ({held} more like it in the last {now - shown:.0f} s)", ()
        return True
