"""Clocks: the wall clock for live media, a virtual media clock for as-fast-as-possible replay.

With the virtual clock, time only moves when media is fed (``advance_to``), and timers fire synchronously
at the moment media time crosses their deadline, so two runs over the same file emit identical messages.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    virtual: bool

    def now(self) -> float: ...

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer: ...


class WallClock:
    virtual = False

    def now(self) -> float:
        return time.time()

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        return asyncio.get_running_loop().call_later(delay, callback)


class _VirtualTimer:
    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class VirtualClock:
    """Media time in seconds from 0; moved forward by the replay as it feeds frames."""

    virtual = True

    def __init__(self) -> None:
        self._now = 0.0
        self._timers: list[tuple[float, int, _VirtualTimer, Callable[[], None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        return self._now

    def call_later(self, delay: float, callback: Callable[[], None]) -> Timer:
        timer = _VirtualTimer()
        heapq.heappush(self._timers, (self._now + max(delay, 0.0), next(self._order), timer, callback))
        return timer

    def advance_to(self, when: float) -> None:
        """Run every timer due up to ``when`` (in deadline order), then set the time."""
        while self._timers and self._timers[0][0] <= when:
            deadline, _, timer, callback = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, deadline)
            callback()
        self._now = max(self._now, when)
