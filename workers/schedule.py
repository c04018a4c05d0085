"""When each executing session's next chunk is due."""

from __future__ import annotations

import heapq
import itertools
from typing import Mapping

from .ownership import Held

__all__ = ["Schedule"]


class Schedule:
    """A heap with lazy deletion, so a worker holding thousands of sessions finds the due
    ones without scanning them all. An entry counts only while it matches its session's
    current ``next_due``."""

    def __init__(self, sessions: Mapping[str, Held]) -> None:
        self._sessions = sessions
        self._heap: list[tuple[float, int, str, Held]] = []
        self._seq = itertools.count()

    def add(self, sid: str, sess: Held) -> None:
        heapq.heappush(self._heap, (sess.next_due, next(self._seq), sid, sess))

    def _valid(self, entry: tuple[float, int, str, Held]) -> bool:
        due, _, sid, sess = entry
        return self._sessions.get(sid) is sess and sess.executing and sess.next_due == due

    def first(self) -> float | None:
        """The earliest due time, or None when nothing executes."""
        while self._heap and not self._valid(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0][0] if self._heap else None

    def pop_due(self, now: float) -> list[tuple[str, Held]]:
        """Every executing session due by ``now``, each once, earliest first."""
        due: list[tuple[str, Held]] = []
        taken: set[int] = set()
        while self._heap and self._heap[0][0] <= now:
            entry = heapq.heappop(self._heap)
            if self._valid(entry) and id(entry[3]) not in taken:
                taken.add(id(entry[3]))
                due.append((entry[2], entry[3]))
        return due
