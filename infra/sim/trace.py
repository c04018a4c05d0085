"""Trace files: CSV ``t_s,session_id,event[,state_mb]``, validated line by line.

A bad file raises :class:`TraceError` naming the file, the 1-based line and the reason.
``state_mb`` is megabytes (10**6 bytes); a blank or absent value keeps the session's size.
A session still open when the trace ends is closed at the last timestamp. Time counts from
0, not from the first row (a launch's first session may come seconds after the service goes
live); a session id is not used again after its close.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from processors.lifecycle import EventKind, SessionEvent
from schemas.errors import TraceError

__all__ = ["Trace", "load_trace", "parse_trace", "write_trace", "MB"]

MB = 1_000_000
_REQUIRED = ("t_s", "session_id", "event")
_KINDS = {k.value: k for k in EventKind}


@dataclass(frozen=True, slots=True)
class Trace:
    """Validated events in time order (implicit closes appended) and where they came from."""

    events: tuple[SessionEvent, ...]
    source: str = "trace"

    @property
    def sessions(self) -> int:
        return len({e.session_id for e in self.events})

    @property
    def duration_s(self) -> float:
        return self.events[-1].t if self.events else 0.0


MAX_T_S = 1e6  # about 11.6 days: past this a time is a typo, and replaying it would not end (nor fit in memory)
MAX_STATE_MB = 1 << 20  # 1 TiB of session state, past any GPU's memory


def _number(text: str, name: str, path: str, line: int, most: float) -> float:
    try:
        if "_" in text:  # Python's float reads 1_000; a CSV number does not
            raise ValueError
        x = float(text)
    except ValueError:
        raise TraceError(path, line, f"{name} is not a number: {text!r}") from None
    if not math.isfinite(x) or x < 0:
        raise TraceError(path, line, f"{name} must be a finite number >= 0, got {text!r}")
    if x > most:
        raise TraceError(path, line, f"{name} is {text}, over the {most:,.0f} a trace may give")
    return x


def parse_trace(rows: Iterable[list[str]], path: str = "trace") -> Trace:
    """Validate CSV rows (the header first) into a :class:`Trace`."""
    it: Iterator[list[str]] = iter(rows)
    first = next(it, None)
    if first is None:
        raise TraceError(path, 1, "the file is empty (a trace starts with the header t_s,session_id,event[,state_mb])")
    header = [h.strip() for h in first]
    missing = [c for c in _REQUIRED if c not in header]
    if missing:  # and what it names instead (`T_S`: column names are lowercase)
        other = [repr(c[:40]) for c in header if c not in (*_REQUIRED, "state_mb")][:3]
        raise TraceError(path, 1, f"header lacks column(s) {', '.join(missing)}"
                         + (f" and names {', '.join(other)} instead" if other else "")
                         + " (need t_s,session_id,event[,state_mb], lowercase)")
    unknown = [c for c in header if c not in (*_REQUIRED, "state_mb")]
    if unknown:  # a misspelt state_mb would leave every size at 0 without a word
        raise TraceError(path, 1, f"header names unknown column(s) {', '.join(repr(c[:40]) for c in unknown[:3])} "
                                  "(a trace has t_s,session_id,event[,state_mb])")
    twice = next((c for i, c in enumerate(header) if c in header[:i]), None)
    if twice is not None:  # which of the two holds the value would be a guess
        raise TraceError(path, 1, f"header names column {twice!r} twice")
    cols = {name: header.index(name) for name in (*_REQUIRED, "state_mb") if name in header}
    need = max(cols[c] for c in _REQUIRED) + 1
    state: dict[str, str] = {}  # session -> "open" | "closed"
    events: list[SessionEvent] = []
    last_t = 0.0
    for line, row in enumerate(it, start=2):
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < need:
            raise TraceError(path, line, f"missing columns: expected {len(header)}, got {len(row)}")
        if len(row) > len(header) and any(c.strip() for c in row[len(header):]):
            raise TraceError(path, line, f"more columns than the header names: expected {len(header)}, got {len(row)}")
        t = _number(row[cols["t_s"]].strip(), "t_s", path, line, MAX_T_S)
        sid = row[cols["session_id"]].strip()
        if not sid:
            raise TraceError(path, line, "empty session_id")
        word = row[cols["event"]].strip().lower()
        kind = _KINDS.get(word)
        if kind is None:
            raise TraceError(path, line, f"unknown event {word!r} (expected open, active, idle or close)")
        size = 0
        if "state_mb" in cols and cols["state_mb"] < len(row) and row[cols["state_mb"]].strip():
            size = int(_number(row[cols["state_mb"]].strip(), "state_mb", path, line, MAX_STATE_MB) * MB)
        if t < last_t:
            raise TraceError(path, line, f"time goes backwards ({t:g} after {last_t:g}); rows must be sorted by t_s")
        last_t = t
        seen = state.get(sid)
        if kind is EventKind.OPEN:
            if seen == "closed":
                raise TraceError(path, line, f"open of session {sid!r} after its close: a session id is not used "
                                             "again (give the new session an id of its own)")
            if seen is not None:
                raise TraceError(path, line, f"duplicate open of session {sid!r}")
            state[sid] = "open"
        elif seen is None:
            raise TraceError(path, line, f"{word} before open of session {sid!r}")
        elif seen == "closed":
            raise TraceError(path, line, f"{word} after close of session {sid!r}")
        elif kind is EventKind.CLOSE:
            state[sid] = "closed"
        events.append(SessionEvent(t, sid, kind, size))
    events.extend(SessionEvent(last_t, sid, EventKind.CLOSE) for sid, s in state.items() if s == "open")
    return Trace(tuple(events), path)


def load_trace(path: str | Path) -> Trace:
    """Read and validate a trace file."""
    name = str(path)
    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            return parse_trace(csv.reader(fh), name)
    except OSError as exc:
        raise TraceError(name, 0, f"cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceError(name, 0, "not a UTF-8 text file") from None
    except csv.Error as exc:  # a field past the csv module's size limit, a NUL byte
        raise TraceError(name, 0, f"not a CSV file ({exc})") from None


def write_trace(events: Iterable[SessionEvent], path: str | Path) -> None:
    """Write events as a trace file (``state_mb`` on open rows, and on others that give a
    new size)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(["t_s", "session_id", "event", "state_mb"])
        for e in events:
            kind = EventKind(e.kind)
            mb = f"{e.state_bytes / MB:.1f}" if kind is EventKind.OPEN or e.state_bytes else ""
            out.writerow([f"{e.t:.3f}", e.session_id, kind.value, mb])
