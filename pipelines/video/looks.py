"""A second look at tracked objects, per stream (faces: ``pipelines.video.faces``; plates:
``pipelines.video.plates``): which tracks are due on this frame, the look itself on a thread of the app's, and what
each track is known as afterwards, added to this frame's objects and events.

The cost is bounded per track (at most one look per ``interval_s`` of media time, the interval doubling after each
look that settles nothing, up to ``BACKOFF_MAX`` times: someone nobody enrolled is not looked at every second
forever), per frame (``max_per_frame``, the largest objects first) and per stream (one look in flight; while it
runs no other is started). A frame waits for its stream's look at most ``max_wait_s``, so that a name or plate
found at once is on that frame's events; a look that takes longer is applied to a later frame, and the stream's
analysis goes on meanwhile: a slow look (a loaded CPU, a crowd) never holds back detection.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import av

from models.detectors import Detection

log = logging.getLogger(__name__)

V = TypeVar("V")
BACKOFF_MAX = 8  # an unsettled track's interval grows to at most this many times interval_s
FORGET_S = 30.0  # a track not seen this long is forgotten (ByteTrack dropped it long before)


class LookSettings(Protocol):
    """What bounds the looks (``video.faces`` and ``video.plates`` both have it)."""

    labels: Collection[str]
    interval_s: float
    max_per_frame: int
    max_wait_s: float


@dataclass(slots=True)
class _Track(Generic[V]):
    value: V | None = None
    next_pts: float = float("-inf")  # not looked at before this media time
    last_pts: float = 0.0
    looks: int = 0  # looks that settled nothing


class TrackLooks(Generic[V]):
    """Subclasses say what a look is (``look``, on ``executor``), when a track needs no more looks (``settled``)
    and which of two values to keep (``keep``); a value is sent as its ``as_message()``, under ``key``."""

    key = "value"

    def __init__(self, executor: Executor, settings: LookSettings) -> None:
        self.executor = executor
        self.labels, self.interval_s = settings.labels, settings.interval_s
        self.max_per_frame, self.max_wait_s = settings.max_per_frame, settings.max_wait_s
        self._tracks: dict[int, _Track[V]] = {}
        self._pending: tuple[asyncio.Future[list[V | None]], list[int]] | None = None

    # ---------------------------------------------------------------- what subclasses define

    def look(self, frame: av.VideoFrame, due: list[Detection]) -> list[V | None]:
        """On ``executor``: a value (or None: nothing found) per due detection."""
        raise NotImplementedError

    def settled(self, value: V | None) -> bool:
        return value is not None

    def keep(self, old: V | None, new: V) -> V:
        return new

    def message(self, value: V) -> dict[str, Any]:
        return value.as_message()  # type: ignore[attr-defined]  # Identity, PlateReading

    def refresh(self, tracks: dict[int, _Track[V]]) -> None:
        """Before each frame: drop what is no longer true (a deleted person's name)."""

    # ---------------------------------------------------------------- per frame

    async def annotate(self, frame: av.VideoFrame, pts: float, detections: list[Detection],
                       objects: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]) -> None:
        for track_id in [t for t, track in self._tracks.items() if pts - track.last_pts > FORGET_S]:
            del self._tracks[track_id]
        self.refresh(self._tracks)
        self._collect()
        due: list[Detection] = []
        for detection in detections:
            if detection.track_id is None or detection.label not in self.labels:
                continue
            track = self._tracks.setdefault(detection.track_id, _Track())
            track.last_pts = pts
            if pts >= track.next_pts and not self.settled(track.value):
                due.append(detection)
        if due and self._pending is None:
            due.sort(key=lambda d: (d.box[2] - d.box[0]) * (d.box[3] - d.box[1]), reverse=True)  # nearest first
            due = due[: self.max_per_frame]
            ids = [d.track_id for d in due if d.track_id is not None]
            for track_id in ids:
                track = self._tracks[track_id]
                track.next_pts = pts + self.interval_s * min(BACKOFF_MAX, 2 ** track.looks)
            future = asyncio.get_running_loop().run_in_executor(self.executor, self.look, frame, due)
            self._pending = (future, ids)
            if self.max_wait_s > 0:
                await asyncio.wait({future}, timeout=self.max_wait_s)
            self._collect()
        known = {track_id: self.message(t.value) for track_id, t in self._tracks.items() if t.value is not None}
        for obj in objects:
            if obj.get("track_id") in known:
                obj[self.key] = known[obj["track_id"]]
        for _, data in events:
            if data.get("track_id") in known:
                data[self.key] = known[data["track_id"]]

    def _collect(self) -> None:
        """Apply the stream's finished look, if any."""
        if self._pending is None or not self._pending[0].done():
            return
        future, ids = self._pending
        self._pending = None
        if future.cancelled():
            return
        if future.exception() is not None:
            log.warning("%s look failed: %s", self.key, future.exception())
            return
        for track_id, value in zip(ids, future.result(), strict=True):
            track = self._tracks.get(track_id)
            if track is None:
                continue
            if value is not None and not self.settled(track.value):
                track.value = self.keep(track.value, value)
            if not self.settled(track.value):
                track.looks += 1
