"""The seams a session pipeline plugs its parts into: what a video analyser is given and returns, what an audio
analyser and the timeline recorder see of their session, and the null parts a session runs with until a real one
is configured. Types only: the parts import these, never the pipeline itself."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import av

from pipelines.clock import Clock
from pipelines.protocol import ServerMessage, SessionConfig, VideoSessionConfig
from pipelines.scene import SceneState

MessageSink = Callable[[ServerMessage], None]


@dataclass(slots=True)
class SampledFrame:
    frame: av.VideoFrame
    pts: float  # seconds since the stream's first frame
    sampled_at: float  # time.perf_counter() when it entered the slot


@dataclass(slots=True)
class DetectionResult:
    width: int
    height: int
    objects: list[dict[str, Any]]
    inference_ms: float
    model: str
    events: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, data): zone/line events
    zone_occupancy: dict[str, list[int]] = field(default_factory=dict)
    line_counts: dict[str, dict[str, int]] = field(default_factory=dict)
    sample_fps: float | None = None  # the rate the analyser asks frames at from now on (motion boost); None: target


class NoMotion:
    """What an analyser returns for a sampled frame it skipped (motion gating, ``video.motion``): no detector
    call, no tracker update, no ``detections`` message; counted as ``frames_no_motion``. The scene is quiet: a
    motion boost ends (sampling returns to the target rate)."""

    __slots__ = ()


NO_MOTION = NoMotion()


@dataclass(slots=True)
class AnalysedFrame:
    """The frame a batch of outgoing messages describes (its ``detections`` and events): the recorder snapshots it
    and cuts the events' clip around it."""

    frame: av.VideoFrame
    pts: float
    objects: list[dict[str, Any]]  # as the analyser returned them (identity, plate, confirmed)


class SessionView(Protocol):
    """What an attached part (the voice loop, the recorder, alerts) may use of its session."""

    session_id: str
    origin: str
    clock: Clock
    config: SessionConfig
    scene: SceneState
    tracks: list[str]

    @property
    def audio_analyzer(self) -> AudioAnalyzer: ...

    def make(self, message_type: type[ServerMessage], **fields: Any) -> ServerMessage: ...

    def send(self, message_type: type[ServerMessage], **fields: Any) -> None: ...

    def emit(self, message: ServerMessage) -> None: ...

    def error(self, code: str, message: str, ref: str | None = None) -> None: ...


class MediaInput(Protocol):
    """What a source feeds: its tracks, then their decoded frames (each call returns once the frame is taken)."""

    def add_track(self, kind: str) -> None: ...

    async def feed_video(self, frame: av.VideoFrame) -> None: ...

    async def feed_audio(self, frame: av.AudioFrame) -> None: ...


class VideoAnalyzer(Protocol):
    """The seam the video pipeline plugs its detectors into."""

    name: str

    def configure(self, config: VideoSessionConfig) -> None:
        """Called at start and whenever the session's video config changes (zones, lines, rate, motion)."""

    async def analyze(self, sampled: SampledFrame) -> DetectionResult | NoMotion | None: ...


class AudioAnalyzer(Protocol):
    """The seam the voice loop plugs into: every audio frame, in order, none dropped."""

    name: str
    output_track: Any  # an aiortc audio track to send back to the peer, or None

    def attach(self, pipeline: SessionView) -> None:
        """Called once: the analyser sends its messages through the pipeline and reads its scene."""

    async def process(self, frame: av.AudioFrame, pts: float) -> None: ...

    async def close(self) -> None: ...


class TimelineSink(Protocol):
    """The seam the timeline recorder (``pipelines.timeline``) plugs into: it stores events, transcripts, replies
    and scene summaries, keeps recent video and writes event clips; it never blocks."""

    def attach(self, pipeline: SessionView) -> None: ...

    def on_video_frame(self, frame: av.VideoFrame, pts: float) -> None:
        """Every decoded frame, for the clips' ring buffer (as a source's reader hands it packets)."""

    def on_outgoing(self, messages: list[ServerMessage],
                    analysed: AnalysedFrame | None = None) -> list[ServerMessage]:
        """Every outgoing message, once, before it is sent; returns what to send. With ``analysed``: the batch of
        one analysed frame, whose events come back with their stored ids, followed by the recorder's own."""

    async def close(self) -> None: ...


class CountingOnlyVideoAnalyzer:
    """Named seam: analyses nothing, so a session reports only frame counts until a detector is configured."""

    name = "counting-only"

    def configure(self, config: VideoSessionConfig) -> None:
        return None

    async def analyze(self, sampled: SampledFrame) -> DetectionResult | None:
        return None


class CountingOnlyAudioAnalyzer:
    """Named seam: consumes audio in order and does nothing with it until the voice loop is configured."""

    name = "counting-only"
    output_track = None

    def attach(self, pipeline: SessionView) -> None:
        return None

    async def process(self, frame: av.AudioFrame, pts: float) -> None:
        return None

    async def close(self) -> None:
        return None
