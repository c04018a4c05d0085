"""How long-running commands log: plain text, or one JSON object a line (``--log-format
json``, or ``CHUNKSERVE_LOG_FORMAT=json`` which the children of ``up`` and of the
provisioner inherit); never colours or terminal control codes, so a log file holds what
was said. JSON lines come from python-json-logger, with the fields ``ts``, ``level``,
``logger``, ``pid``, ``message`` and whatever a record adds with ``extra=``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FORMATS", "logging_config"]

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
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "default",
                                 "stream": "ext://sys.stderr"}},
        "root": {"level": level.upper(), "handlers": ["default"]},
    }
