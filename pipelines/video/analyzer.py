"""The detector-backed video analyser: motion gating, batched detection, then this stream's own tracker and zones.

Gating (``video.motion``, on by default): a sampled frame goes to the detector when

* it is the stream's first (or the first after a config change),
* it shows motion (``pipelines.video.motion``: checked on a small grey copy, on the batcher's conversion threads),
* the last detection started a new track (the tracker gives an id from the second sighting: the next frame
  confirms it, so a still object's id and ``zone.enter`` come as early as ungated),
* a track was moving at the last detection (a runner leaves no mark on the motion background, so its leaving the
  view shows no motion; the tracker finds it lost at the next detection, as it would ungated),
* a track is not trusted yet and its score history is still filling (``video.objects``: the next sightings decide
  it, as they would ungated),
* a confirmed track was lost by the last detection and not yet dropped (an object left or is occluded: follow it
  at the full rate until it is found again or dropped, so its ``zone.exit`` comes as it would ungated), or
* objects are in view and the last detection is ``refresh_s`` old (a parked car, a seated person stays tracked).

Any other frame is skipped (``NO_MOTION``): no detector call and no tracker update. The tracker ages tracks per
update, not per second, so a skipped frame leaves tracks, their ids and zone occupancy exactly as they were: a
still object neither exits nor re-enters its zone across the skipped frames.

Motion boost (``video.motion.boost_fps``): while the gate sees motion and the shared detector is busy less than
half its time, the stream asks to be sampled at ``boost_fps`` instead of ``target_fps`` (a runner is seen twice
as often); a quiet frame (``NO_MOTION``) returns it to the target. The tracker is told the rate, so a lost track is
kept for the same seconds at either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import av

from models.detectors import Detection
from pipelines.ports import NO_MOTION, DetectionResult, NoMotion, SampledFrame
from pipelines.protocol import MotionConfig, VideoSessionConfig
from pipelines.video.batcher import FrameDetector
from pipelines.video.motion import MotionDetector
from pipelines.video.tracking import StreamTracker


class TrackAnnotator(Protocol):
    """Adds what it knows of tracks (``identity``: ``pipelines.video.faces``; ``plate``: ``pipelines.video.plates``)
    to this frame's objects and events, in place; one per stream."""

    async def annotate(self, frame: av.VideoFrame, pts: float, detections: list[Detection],
                       objects: list[dict[str, Any]], events: list[tuple[str, dict[str, Any]]]) -> None: ...


class DetectorVideoAnalyzer:
    """One per stream (it owns the stream's tracker and motion state); the batcher and the model are shared (in this
    process, or in detector worker processes: ``FrameDetector``)."""

    def __init__(self, batcher: FrameDetector, annotators: Sequence[TrackAnnotator] = ()) -> None:
        self.batcher = batcher
        self.annotators = tuple(annotators)
        self.name = batcher.name
        self.tracker = StreamTracker([], [])
        self.motion = MotionDetector()
        self._motion_config = MotionConfig()
        self._last_detected: float | None = None  # pts of the last frame sent to the detector
        self._target_fps = 5.0
        self._moving = False  # the last motion check saw motion
        self._objects_in_view = False  # the last detection found something (or the tracker holds tracks)

    def configure(self, config: VideoSessionConfig) -> None:
        self.tracker.configure(config.zones, config.lines, frame_rate=config.target_fps, objects=config.objects)
        self._target_fps = config.target_fps
        self.motion.configure(config.motion)
        self._motion_config = config.motion
        self._last_detected = None  # new zones or rules: look at the next frame whatever moves

    async def analyze(self, sampled: SampledFrame) -> DetectionResult | NoMotion:
        if self._motion_config.enabled and not await self._worth_detecting(sampled):
            self.tracker.set_rate(self._target_fps)
            return NO_MOTION
        result = await self.batcher.detect(sampled.frame, stream=id(self))
        width, height = sampled.frame.width, sampled.frame.height
        events = self.tracker.update(result.detections, width, height, sampled.pts)
        self._last_detected = sampled.pts
        self._objects_in_view = bool(result.detections) or self.tracker.tracking
        objects = [d.as_message() for d in result.detections]
        scene_events = [(e.name, e.data) for e in events]
        for annotator in self.annotators:
            await annotator.annotate(sampled.frame, sampled.pts, result.detections, objects, scene_events)
        return DetectionResult(
            width=width,
            height=height,
            objects=objects,
            inference_ms=result.inference_ms,
            model=self.name,
            events=scene_events,
            zone_occupancy=self.tracker.occupancy,
            line_counts=self.tracker.line_counts,
            sample_fps=self._boost(),
        )

    def _boost(self) -> float | None:
        """The rate to sample at next: ``boost_fps`` while motion goes on and the detector has headroom."""
        config = self._motion_config
        boosted = (config.enabled and self._moving and config.boost_fps > self._target_fps
                   and self.batcher.has_headroom)
        self.tracker.set_rate(config.boost_fps if boosted else self._target_fps)
        return config.boost_fps if boosted else None

    async def _worth_detecting(self, sampled: SampledFrame) -> bool:
        # The motion check runs on every sampled frame (off the loop), so the background keeps learning.
        motion = await self.batcher.offload(self.motion.check, sampled.frame, sampled.pts)
        self._moving = motion.moving
        tracker = self.tracker
        if (self._last_detected is None or motion.moving or tracker.lost or tracker.unconfirmed or tracker.undecided
                or tracker.moving):
            return True
        return self._objects_in_view and sampled.pts - self._last_detected >= self._motion_config.refresh_s
