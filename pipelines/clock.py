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


class ArrivalDelay:
    """How late a live track's frames reach the pipeline, judged by their own timestamps: arrival time minus media
    time, above the least seen (the path's fixed delay). It grows when the server reads its sockets or decodes
    more slowly than media arrives (the state in which ICE consent replies wait behind media and sessions drop).
    The floor may rise by ``drift_per_s`` so that a sender's clock running slow is not read as delay."""

    def __init__(self, drift_per_s: float = 0.001) -> None:
        self.drift_per_s = drift_per_s
        self.seconds = 0.0
        self._floor: float | None = None
        self._last_arrival: float | None = None

    def observe(self, media_s: float, arrival_s: float) -> float:
        offset = arrival_s - media_s
        if self._floor is None or offset < self._floor:
            self._floor = offset
        elif self._last_arrival is not None:
            self._floor = min(offset, self._floor + self.drift_per_s * (arrival_s - self._last_arrival))
        self._last_arrival = arrival_s
        self.seconds = offset - self._floor
        return self.seconds
