"""``SessionClient``: the small producer library for front ends publishing sessions."""

from __future__ import annotations

import time
from typing import Callable

from schemas.errors import ConfigError
from schemas.records import (InputPushed, Record, SessionActive, SessionClosed, SessionIdle,
                             SessionOpened)
from schemas.topics import SESSION_EVENTS, SESSION_INPUTS

from .config import Settings
from .kafka import RecordProducer
from .topics import require_topics

__all__ = ["SessionClient"]


class SessionClient:
    """Opens sessions, pushes inputs (numbered per session), flips them idle/active, closes them.

    Input sequence numbers start at 1 and are kept per session by this client; a front end
    that restarts passes ``next_seq`` so numbering continues.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._producer: RecordProducer | None = None
        self._settings, self._clock = settings, clock
        self._seq: dict[str, int] = {}

    async def __aenter__(self) -> "SessionClient":
        """Start; the topics it writes must be on the broker (made by `chunkserve topics` or
        the fleet's start): on another prefix it is refused here, in one line, not after a
        send's 40 s metadata wait (and with no producer made, none is left unclosed)."""
        await require_topics(self._settings, [SESSION_EVENTS, SESSION_INPUTS], "SessionClient")
        self._producer = await RecordProducer(self._settings, client_id="chunkserve-client").start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None

    async def _send(self, record: Record) -> None:
        if self._producer is None:
            raise ConfigError("SessionClient", "not started: use it as `async with SessionClient(settings) as client`",
                              "SessionClient")
        await self._producer.send(record)

    async def open(self, session_id: str, prompt: str = "", state_bytes: int = 0) -> None:
        self._seq.setdefault(session_id, 0)
        await self._send(SessionOpened(session_id=session_id, ts=self._clock(),
                                                prompt=prompt, state_bytes=state_bytes))

    async def push(self, session_id: str, payload: str, kind: str = "text",
                   next_seq: int | None = None) -> int:
        """Publish one input; returns its sequence number."""
        seq = next_seq if next_seq is not None else self._seq.get(session_id, 0) + 1
        self._seq[session_id] = seq
        await self._send(InputPushed(session_id=session_id, seq=seq, kind=kind,  # type: ignore[arg-type]
                                              payload=payload, ts=self._clock()))
        return seq

    async def idle(self, session_id: str) -> None:
        await self._send(SessionIdle(session_id=session_id, ts=self._clock()))

    async def active(self, session_id: str) -> None:
        await self._send(SessionActive(session_id=session_id, ts=self._clock()))

    async def close(self, session_id: str, reason: str = "user") -> None:
        self._seq.pop(session_id, None)
        await self._send(SessionClosed(session_id=session_id, ts=self._clock(),
                                                reason=reason))
