"""Prometheus metrics of the pipelines (the server adds its own in ``server.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter

FRAMES = Counter(
    "vigil_frames_total", "Media frames by origin (webrtc, rtsp, file) and stage.", ["origin", "kind", "stage"]
)
MESSAGES_SENT = Counter("vigil_messages_sent_total", "Protocol messages sent to clients.", ["type"])
ERRORS = Counter("vigil_errors_total", "Errors reported to clients or logged, by code.", ["code"])


class PipelineMetrics:
    """The counters one pipeline increments, bound to its origin label once."""

    def __init__(self, origin: str) -> None:
        self.frames_in = FRAMES.labels(origin=origin, kind="video", stage="in")
        self.frames_sampled = FRAMES.labels(origin=origin, kind="video", stage="sampled")
        self.frames_analyzed = FRAMES.labels(origin=origin, kind="video", stage="analyzed")
        self.frames_dropped = FRAMES.labels(origin=origin, kind="video", stage="dropped")
        self.audio_frames_in = FRAMES.labels(origin=origin, kind="audio", stage="in")
