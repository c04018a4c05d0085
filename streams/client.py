"""``SessionClient``: the small producer library for front ends publishing sessions."""

from __future__ import annotations

import time
from typing import Callable

from schemas.errors import ConfigError
from schemas.records import (InputPushed, SessionActive, SessionClosed, SessionIdle,
                             SessionOpened)
from schemas.topics import SESSION_EVENTS, SESSION_INPUTS

from .config import Settings
from .kafka import RecordProducer
from .topics import TopicCatalogue, partition_counts

__all__ = ["SessionClient"]


class SessionClient:
    """Opens sessions, pushes inputs (numbered per session), flips them idle/active, closes them.

    Input sequence numbers start at 1 and are kept per session by this client; a front end
    that restarts passes ``next_seq`` so numbering continues.
    """

    def __init__(self, settings: Settings, clock: Callable[[], float] = time.time) -> None:
        self._producer = RecordProducer(settings, client_id="chunkserve-client")
        self._settings, self._clock = settings, clock
        self._seq: dict[str, int] = {}

    async def __aenter__(self) -> "SessionClient":
        """Start; the topics it writes must be on the broker (made by `chunkserve topics` or
        the fleet's start): on another prefix it is refused here, in one line, not after a
        send's 40 s metadata wait."""
        catalogue = TopicCatalogue.from_settings(self._settings)
        names = [catalogue.name(t) for t in (SESSION_EVENTS, SESSION_INPUTS)]
        missing = [n for n in names if n not in await partition_counts(self._settings, names)]
        if missing:
            raise ConfigError("topic_prefix", f"no topic {', '.join(missing)} on the broker: the fleet's prefix "
                              "differs (CHUNKSERVE_TOPIC_PREFIX, or the file CHUNKSERVE_CONFIG names), or "
                              "`chunkserve topics` has not made them", "SessionClient")
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
