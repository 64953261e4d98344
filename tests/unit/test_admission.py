"""Admission from measured load: the event-loop thread's CPU share decides whether one more session fits."""

from __future__ import annotations

import asyncio
import time

from pipelines.clock import ArrivalDelay
from server.media.admission import LoopLoadMonitor


class ClocksForTest:
    """The monitor's two clock seams, moved by hand: thread CPU seconds and wall seconds."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self.wall = 0.0

    def tick(self, busy_share: float, seconds: float = 1.0) -> None:
        self.cpu += busy_share * seconds
        self.wall += seconds


def _monitor(clocks: ClocksForTest) -> LoopLoadMonitor:
    return LoopLoadMonitor(period_s=1.0, window=3, thread_clock=lambda: clocks.cpu, wall_clock=lambda: clocks.wall)


def test_the_load_is_the_busiest_second_of_the_window() -> None:
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    for share in (0.2, 0.6, 0.3):
        clocks.tick(share)
        monitor.sample(0)
    assert abs(monitor.load - 0.6) < 1e-9
    for share in (0.1, 0.1, 0.1):  # the busy second leaves the window
        clocks.tick(share)
        monitor.sample(0)
    assert abs(monitor.load - 0.1) < 1e-9


def _settle(monitor: LoopLoadMonitor, clocks: ClocksForTest, share: float, sessions: int, seconds: int = 3) -> None:
    for _ in range(seconds):
        clocks.tick(share)
        monitor.sample(sessions, sessions)


def test_one_more_session_is_refused_when_its_measured_cost_would_pass_the_limit() -> None:
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    _settle(monitor, clocks, 0.1, 0)  # idle: 10 % of a core
    _settle(monitor, clocks, 0.5, 4)  # four settled sessions: 50 %, so 10 % each above the idle floor
    assert monitor.session_cost is not None and abs(monitor.session_cost - 0.1) < 1e-9
    assert monitor.refusal(occupied=4, limit=0.65, max_delay_s=1.0, retry_after_s=5) is None  # 0.5 + 0.1 fits
    # two more already being answered (not in the load yet) and this one: the floor 0.1 + 7 x 0.1
    refusal = monitor.refusal(occupied=6, limit=0.65, max_delay_s=1.0, retry_after_s=5)
    assert refusal is not None and refusal.retry_after_s == 5 and "80%" in refusal.message
    assert monitor.refusal(occupied=4, limit=0.55, max_delay_s=1.0, retry_after_s=5) is not None


def test_sessions_that_just_ended_do_not_count_against_the_next_ones() -> None:
    """Eight sessions end; a burst of eight new offers follows before the window forgets them: each offer counts
    the sessions open now at the measured cost, not the old load plus the new ones (bench/survival.py refused the
    eighth of eight that way)."""
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    _settle(monitor, clocks, 0.02, 0)
    _settle(monitor, clocks, 0.34, 8)  # 4 % each
    clocks.tick(0.34)
    monitor.sample(0, 0)  # they end; the window still holds their seconds
    for occupied in range(8):
        assert monitor.refusal(occupied=occupied, limit=0.7, max_delay_s=1.0, retry_after_s=5) is None, occupied
    assert monitor.refusal(occupied=17, limit=0.7, max_delay_s=1.0, retry_after_s=5) is not None  # 0.02 + 18 x 0.04


def test_no_cost_is_learnt_while_sessions_come_and_go() -> None:
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    for sessions in (1, 2, 3):  # a ramp: no window of the same settled sessions
        clocks.tick(0.1 * sessions)
        monitor.sample(sessions, sessions)
    assert monitor.session_cost is None
    clocks.tick(0.4)
    monitor.sample(2, 4)  # two of four still starting
    assert monitor.session_cost is None


def test_nothing_is_refused_before_a_session_was_measured() -> None:
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    clocks.tick(0.3)
    monitor.sample(0)
    assert monitor.session_cost is None
    assert monitor.refusal(occupied=5, limit=0.5, max_delay_s=1.0, retry_after_s=5) is None
    # the load alone is over the limit
    assert monitor.refusal(occupied=0, limit=0.2, max_delay_s=1.0, retry_after_s=5) is not None


def test_the_real_thread_clock_sees_a_busy_loop() -> None:
    """The default clocks: a loop thread that spins for most of a period reads as busy; an idle one does not."""

    async def measure(busy: bool) -> float:
        monitor = LoopLoadMonitor(period_s=0.2, window=2)
        monitor.sample(0)
        started = time.monotonic()
        while time.monotonic() - started < 0.3:
            if not busy:
                await asyncio.sleep(0.05)
        monitor.sample(0)
        return monitor.load

    # Loose bounds: on a loaded machine a spinning thread gets a fraction of a core; a sleeping one uses ~nothing.
    assert asyncio.run(measure(busy=True)) > 0.15
    assert asyncio.run(measure(busy=False)) < 0.1


def test_media_arriving_late_refuses_whatever_the_load() -> None:
    clocks = ClocksForTest()
    monitor = _monitor(clocks)
    monitor.sample(0)
    clocks.tick(0.05)
    monitor.sample(2, media_delay_s=1.5)
    refusal = monitor.refusal(occupied=2, limit=0.9, max_delay_s=1.0, retry_after_s=5)
    assert refusal is not None and "1.5 s late" in refusal.message
    for _ in range(3):  # caught up: the late second leaves the window
        clocks.tick(0.05)
        monitor.sample(2, media_delay_s=0.1)
    assert monitor.refusal(occupied=2, limit=0.9, max_delay_s=1.0, retry_after_s=5) is None


def test_arrival_delay_is_lateness_above_the_path_floor() -> None:
    delay = ArrivalDelay(drift_per_s=0.001)
    for second in range(10):  # in time: a fixed 40 ms path delay is no lateness
        assert delay.observe(float(second), second + 0.04) < 1e-9
    assert abs(delay.observe(10.0, 12.04) - 2.0) < 0.01  # read 2 s late (the floor rose 2 ms meanwhile)
    assert delay.observe(11.0, 11.04) < 1e-9  # caught up


def test_arrival_delay_forgives_a_slow_sender_clock() -> None:
    """A sender whose clock runs 0.05 % slow drifts 0.5 ms a second: the floor follows it, no delay builds up."""
    delay = ArrivalDelay(drift_per_s=0.001)
    readings = [delay.observe(second * 0.9995, float(second)) for second in range(0, 3600, 10)]
    assert max(readings) < 0.01
