"""Admission from measured load: refuse a new WebRTC session before it would starve the running ones.

Every session's packets are read, decrypted and depacketised on the one event-loop thread. When that thread
saturates, datagrams queue in the kernel, ICE consent replies wait behind seconds of media, and after 30 s aioice
declares consent expired: all sessions drop together (eight audio+video sessions on two cores). The
process's CPU says nothing about it (the detector keeps a core busy whatever the load, by design), so the signal
is the loop thread's own CPU time (``time.thread_time`` sampled on that thread): its share of one core over the
last few seconds. A new offer is refused (503 + Retry-After) when the load with one more session would pass
``sessions.max_loop_load``: every session open or being answered counts at the measured cost of a session (the
load above the idle floor divided by the sessions that made it, learnt while the same sessions stay open), since
sessions that have just started do not show in the load yet, and sessions that have just ended still do. And
since on a machine shared with other processes the loop thread can fall behind while waiting for a core rather
than using one, an offer is refused as well while any live session's media reaches its pipeline more than
``sessions.max_media_delay_s`` behind its own timestamps.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import Gauge

MEDIA_DELAY = Gauge("vigil_media_delay_seconds", "How far behind its own timestamps the latest media of the most "
                    "delayed live session reached its pipeline (0 while the server keeps up).")
LOOP_LOAD = Gauge("vigil_event_loop_load", "Share of one core the event-loop thread used over the last seconds "
                  "(it reads every session's media; near 1.0, sessions start to drop).")


@dataclass(frozen=True)
class Refusal:
    message: str
    retry_after_s: float


class LoopLoadMonitor:
    """Samples the event-loop thread's CPU share once per ``period_s``; keeps the last ``window`` samples."""

    def __init__(self, *, period_s: float = 1.0, window: int = 5,
                 thread_clock: Callable[[], float] = time.thread_time,
                 wall_clock: Callable[[], float] = time.monotonic) -> None:
        self.period_s = period_s
        self._samples: deque[tuple[float, int, int]] = deque(maxlen=window)  # (share, settled, open sessions)
        self._delays: deque[float] = deque(maxlen=window)
        self._thread_clock, self._wall_clock = thread_clock, wall_clock
        self._last: tuple[float, float] | None = None
        self._idle_floor: float | None = None  # the lowest load seen with no session open
        self.session_cost: float | None = None  # the measured load one settled session adds
        self._task: asyncio.Task[None] | None = None

    @property
    def window_s(self) -> float:
        """How long a new session takes to show in the load (until then it is not counted as settled)."""
        return self.period_s * (self._samples.maxlen or 1)

    @property
    def load(self) -> float:
        """The busiest second of the window (what /metrics shows)."""
        return max((share for share, _, _ in self._samples), default=0.0)

    @property
    def latest(self) -> float:
        return self._samples[-1][0] if self._samples else 0.0

    @property
    def media_delay_s(self) -> float:
        return max(self._delays, default=0.0)

    def sample(self, settled: int, open_sessions: int | None = None, media_delay_s: float = 0.0) -> float:
        """Record the share of one core this thread used since the last sample. ``settled``: sessions open for a
        whole window; ``open_sessions``: all open (default: the settled ones); ``media_delay_s``: how far behind
        its media the most delayed session runs. Call on the loop thread."""
        open_sessions = settled if open_sessions is None else open_sessions
        self._delays.append(media_delay_s)
        MEDIA_DELAY.set(media_delay_s)
        now = (self._thread_clock(), self._wall_clock())
        if self._last is not None and now[1] > self._last[1]:
            share = (now[0] - self._last[0]) / (now[1] - self._last[1])
            self._samples.append((share, settled, open_sessions))
            LOOP_LOAD.set(self.load)
            if open_sessions == 0:
                self._idle_floor = share if self._idle_floor is None else min(self._idle_floor, share)
            self._learn_cost()
        self._last = now
        return self.load

    def _learn_cost(self) -> None:
        """A session's cost, from a full window in which the same sessions, all settled, were open (a window in
        which sessions came or went says nothing clean about any of them)."""
        if len(self._samples) < (self._samples.maxlen or 1):
            return
        counts = {(settled, open_sessions) for _, settled, open_sessions in self._samples}
        if len(counts) != 1:
            return
        ((settled, open_sessions),) = counts
        if settled == 0 or settled != open_sessions:
            return
        mean = sum(share for share, _, _ in self._samples) / len(self._samples)
        self.session_cost = max(mean - (self._idle_floor or 0.0), 0.0) / settled

    def refusal(self, occupied: int, limit: float | None, max_delay_s: float | None,
                retry_after_s: float) -> Refusal | None:
        """Why one more session must wait, or None. ``occupied``: sessions open or being answered, each counted
        at the measured cost of a session (the ones still starting do not show in the load yet); before a cost
        is measured, only the load itself counts. Media already arriving ``max_delay_s`` late means the server is
        past capacity, whatever the load says (on a machine shared with other processes the loop thread waits for
        a core without using one). None: that check off."""
        if max_delay_s is not None and self.media_delay_s > max_delay_s:
            return Refusal(f"the server is at capacity: live media reaches it {self.media_delay_s:.1f} s late",
                           retry_after_s)
        if limit is None:
            return None
        cost = self.session_cost or 0.0
        predicted = max(self.latest, (self._idle_floor or 0.0) + cost * occupied) + cost
        if predicted <= limit:
            return None
        return Refusal(f"the server is at capacity: its media thread would be {predicted:.0%} busy with one more "
                       f"session (limit {limit:.0%})", retry_after_s)

    def start(self, settled: Callable[[], int], open_sessions: Callable[[], int],
              media_delay_s: Callable[[], float]) -> None:
        async def run() -> None:
            while True:
                self.sample(settled(), open_sessions(), media_delay_s())
                await asyncio.sleep(self.period_s)

        self._task = asyncio.create_task(run(), name="loop-load")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
