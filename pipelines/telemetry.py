"""Prometheus metrics of the pipelines (the server adds its own in ``server.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

FRAMES = Counter(
    "vigil_frames_total",
    "Media frames by origin (webrtc, rtsp, file) and stage (in, sampled, analyzed, dropped, no_motion, failed).",
    ["origin", "kind", "stage"],
)
MESSAGES_SENT = Counter("vigil_messages_sent_total", "Protocol messages sent to clients.", ["type"])
ERRORS = Counter("vigil_errors_total", "Errors reported to clients or logged, by code.", ["code"])


BATCH_SIZE = Histogram("vigil_inference_batch_size", "Frames per batched inference call.", ["model"],
                       buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32))
INFERENCE_MS = Histogram("vigil_inference_ms", "Batched inference time (model only), ms.", ["model"],
                         buckets=(5, 10, 20, 40, 80, 160, 320, 640, 1280, 2560))
END_TO_END_MS = Histogram("vigil_video_end_to_end_ms", "Frame sampled -> detections sent, ms.", ["origin"],
                          buckets=(10, 20, 40, 80, 160, 320, 640, 1280, 2560, 5120))
VOICE_STAGE_MS = Histogram("vigil_voice_stage_ms", "Voice turn stage latencies, ms.", ["stage"],
                           buckets=(25, 50, 100, 150, 250, 400, 600, 800, 1000, 1200, 1600, 2400, 4000, 8000))
VOICE_PREFILL = Counter("vigil_voice_prefill_total", "Streaming prefill outcomes (reused / restarted).", ["outcome"])
VOICE_BARGE_INS = Counter("vigil_voice_barge_ins_total", "Replies interrupted by the user.")
DETECTOR_OUTAGES = Counter(
    "vigil_detector_outages_total",
    "Detector worker processes lost and restarted (video.detector_workers), by reason: died, hung, start_timeout.",
    ["reason"])
DETECTOR_OUTAGE_FRAMES = Counter(
    "vigil_detector_outage_frames_total",
    "Frames a detector outage cost: in flight when a worker was lost, or sent while it restarted.")
DETECTOR_WORKER_PID = Gauge("vigil_detector_worker_pid", "Process id of each detector worker (0: restarting).",
                            ["worker"])
SCENE_EVENTS = Counter("vigil_scene_events_total", "Zone and line events.", ["name"])


class InferenceMetrics:
    def __init__(self, model: str) -> None:
        self.batch_size = BATCH_SIZE.labels(model=model)
        self.inference_ms = INFERENCE_MS.labels(model=model)

    def observe(self, batch_size: int, elapsed_ms: float) -> None:
        self.batch_size.observe(batch_size)
        self.inference_ms.observe(elapsed_ms)


class PipelineMetrics:
    """The counters one pipeline increments, bound to its origin label once."""

    def __init__(self, origin: str) -> None:
        self.frames_in = FRAMES.labels(origin=origin, kind="video", stage="in")
        self.frames_sampled = FRAMES.labels(origin=origin, kind="video", stage="sampled")
        self.frames_analyzed = FRAMES.labels(origin=origin, kind="video", stage="analyzed")
        self.frames_dropped = FRAMES.labels(origin=origin, kind="video", stage="dropped")
        self.frames_no_motion = FRAMES.labels(origin=origin, kind="video", stage="no_motion")
        self.frames_failed = FRAMES.labels(origin=origin, kind="video", stage="failed")
        self.audio_frames_in = FRAMES.labels(origin=origin, kind="audio", stage="in")
        self.end_to_end_ms = END_TO_END_MS.labels(origin=origin)
