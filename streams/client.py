"""``SessionClient``: the small producer library for front ends publishing sessions."""

from __future__ import annotations

import time
from typing import Callable

from schemas.records import (InputPushed, SessionActive, SessionClosed, SessionIdle,
                             SessionOpened)

from .config import Settings
from .kafka import RecordProducer

__all__ = ["SessionClient"]


class SessionClient:
    """Opens sessions, pushes inputs (numbered per session), flips them idle/active, closes them.

    Input sequence numbers start at 1 and are kept per session by this client; a front end
    that restarts passes ``next_seq`` so numbering continues.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._producer = RecordProducer(settings, client_id="chunkserve-client")
        self._clock = clock
        self._seq: dict[str, int] = {}

    async def __aenter__(self) -> "SessionClient":
        await self._producer.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._producer.stop()

    async def open(self, session_id: str, prompt: str = "", state_bytes: int = 0) -> None:
        self._seq.setdefault(session_id, 0)
        await self._producer.send(SessionOpened(session_id=session_id, ts=self._clock(),
                                                prompt=prompt, state_bytes=state_bytes))

    async def push(self, session_id: str, payload: str, kind: str = "text",
                   next_seq: int | None = None) -> int:
        """Publish one input; returns its sequence number."""
        seq = next_seq if next_seq is not None else self._seq.get(session_id, 0) + 1
        self._seq[session_id] = seq
        await self._producer.send(InputPushed(session_id=session_id, seq=seq, kind=kind,  # type: ignore[arg-type]
                                              payload=payload, ts=self._clock()))
        return seq

    async def idle(self, session_id: str) -> None:
        await self._producer.send(SessionIdle(session_id=session_id, ts=self._clock()))

    async def active(self, session_id: str) -> None:
        await self._producer.send(SessionActive(session_id=session_id, ts=self._clock()))

    async def close(self, session_id: str, reason: str = "user") -> None:
        self._seq.pop(session_id, None)
        await self._producer.send(SessionClosed(session_id=session_id, ts=self._clock(),
                                                reason=reason))
