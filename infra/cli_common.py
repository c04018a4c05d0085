"""What the command-line modules share: the consoles, the ``--config`` file's settings,
and a JSON result written where ``--json`` says."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from infra.outputs import write_output
from schemas.errors import ConfigError
from streams.config import Settings

__all__ = ["console", "err_console", "CONFIG", "load_settings", "write_json", "int_list"]

console = Console(emoji=False, soft_wrap=True)  # piped output keeps paths whole; ":x:" stays text
err_console = Console(stderr=True, emoji=False, soft_wrap=True)
CONFIG: dict[str, Optional[Path]] = {"path": None}  # the global --config, set as the command line is read


def load_settings(require_endpoints: bool = True, redis: bool = True) -> Settings:
    """The configured settings; with ``require_endpoints``, the broker and Redis (without
    ``redis``, the broker alone: a command that reads the topics only) must be set and answer
    (checked once, by the command a person started: a child of ``up`` or of the provisioner
    keeps retrying as its clients do)."""
    from streams.config import PARENT_PID_ENV
    from streams.config_file import env_var, load_with_sources
    from streams.preflight import check

    path = CONFIG["path"]
    try:
        settings, sources = load_with_sources(path, os.environ)
        needed = (("kafka.bootstrap", settings.kafka.bootstrap), ("redis.url", settings.redis.url))[:2 if redis else 1]
        missing = [k for k, v in needed if not v]
        if require_endpoints and missing:
            where = " or ".join(([f"{', '.join(missing)} in {path}"] if path else [])
                                + [", ".join(env_var(k) for k in missing)])
            err_console.print(f"[red]configuration error:[/red] {', '.join(missing)}: not set (set {where}; `chunkserve "
                              "broker start` and `chunkserve redis start` run them on this machine, `chunkserve demo` "
                              "starts embedded ones)", soft_wrap=True, markup=True, highlight=False)
            raise typer.Exit(2)
        if require_endpoints and not os.environ.get(PARENT_PID_ENV):
            asyncio.run(check(settings, sources, redis=redis))
    except ConfigError as exc:
        err_console.print(f"[red]configuration error:[/red] {exc}", soft_wrap=True)
        raise typer.Exit(2)
    return settings


def write_json(result: dict, json_out: Optional[Path]) -> None:
    """``result`` to ``--json`` (checked before the work by ``json_option``), else to stdout;
    if the file cannot be written after all, to stdout too, so a long run's result is not
    lost, then one line and exit code 2 (``ConfigError``)."""
    text = json.dumps(result, indent=2, default=str) + "\n"
    if json_out is None:
        sys.stdout.write(text)
        return
    try:
        write_output("json", json_out, text)
    except ConfigError:
        sys.stdout.write(text)
        sys.stdout.flush()
        raise
    console.print(f"wrote {json_out}")


def int_list(text: str, option: str) -> list[int]:
    """An option's comma-separated positive integers, or a usage error naming ``option``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=option)
    if not values or min(values) < 1:
        raise typer.BadParameter("expected positive integers", param_hint=option)
    return values
