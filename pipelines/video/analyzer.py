"""The detector-backed video analyser: batched detection, then this stream's own tracker and zones."""

from __future__ import annotations

from pipelines.protocol import VideoSessionConfig
from pipelines.session import DetectionResult, SampledFrame
from pipelines.video.batcher import InferenceBatcher
from pipelines.video.tracking import StreamTracker


class DetectorVideoAnalyzer:
    """One per stream (it owns the stream's tracker state); the batcher and the model are shared."""

    def __init__(self, batcher: InferenceBatcher) -> None:
        self.batcher = batcher
        self.name = batcher.detector.name
        self.tracker = StreamTracker([], [])

    def configure(self, config: VideoSessionConfig) -> None:
        self.tracker.configure(config.zones, config.lines, frame_rate=config.target_fps)

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        result = await self.batcher.detect(sampled.frame, stream=id(self))
        width, height = sampled.frame.width, sampled.frame.height
        events = self.tracker.update(result.detections, width, height, sampled.pts)
        return DetectionResult(
            width=width,
            height=height,
            objects=[d.as_message() for d in result.detections],
            inference_ms=result.inference_ms,
            model=self.name,
            events=[(e.name, e.data) for e in events],
            zone_occupancy=self.tracker.occupancy,
            line_counts=self.tracker.line_counts,
        )
