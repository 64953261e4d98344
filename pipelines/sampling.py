"""Which frames a session analyses, and when: media time from a track's timestamps, the sampler that picks
frames at the target rate by that time, and the one-frame slot that drops a frame the analyser had no time for."""

from __future__ import annotations

import asyncio

import av

from pipelines.ports import SampledFrame


class LatestFrameSlot:
    """Holds at most one frame; a newer frame replaces (drops) an unconsumed older one."""

    def __init__(self) -> None:
        self._item: SampledFrame | None = None
        self._ready = asyncio.Event()

    def put(self, item: SampledFrame) -> bool:
        """Store ``item``; True when it replaced a frame that was never analysed."""
        dropped = self._item is not None
        self._item = item
        self._ready.set()
        return dropped

    async def get(self) -> SampledFrame:
        await self._ready.wait()
        self._ready.clear()
        item, self._item = self._item, None
        assert item is not None
        return item


class FpsSampler:
    """Decides by media time which frames are due at the target rate; a slower stream is taken whole."""

    def __init__(self, target_fps: float) -> None:
        self.target_fps = target_fps
        self._next_due: float | None = None

    def due(self, pts: float) -> bool:
        interval = 1.0 / self.target_fps
        if self._next_due is None or pts + 1e-3 >= self._next_due:
            # Keep a steady grid, but never let a gap (or a rate change) cause a burst of catch-up samples.
            grid = (self._next_due or pts) + interval
            self._next_due = grid if grid > pts else pts + interval
            return True
        return False

    def retarget(self, target_fps: float) -> None:
        self.target_fps = target_fps
        self._next_due = None


class TrackTime:
    """Seconds since a track's first frame. WebRTC timestamps start at a random offset and, being RTP's 32-bit
    timestamps (aiortc hands them over as pts), wrap: at 90 kHz within 13 h, often much sooner. Unwrapped here;
    otherwise media time would stick at 0 after the wrap and the sampler would never take a frame again."""

    RTP_WRAP = 1 << 32

    def __init__(self) -> None:
        self._origin: float | None = None
        self._last = 0.0
        self._last_pts: int | None = None
        self._wraps = 0

    def of(self, frame: av.VideoFrame | av.AudioFrame) -> float:
        if frame.pts is None or frame.time_base is None:
            return self._last
        pts = frame.pts
        if self._last_pts is not None and self._last_pts < self.RTP_WRAP and self._last_pts - pts > self.RTP_WRAP // 2:
            self._wraps += 1
        self._last_pts = pts
        absolute = float((pts + self._wraps * self.RTP_WRAP) * frame.time_base)
        if self._origin is None:
            self._origin = absolute
        self._last = max(absolute - self._origin, 0.0)
        return self._last
