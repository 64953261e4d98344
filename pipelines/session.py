"""One session's media pipeline: frames in, messages out. Pure asyncio; knows nothing of HTTP or WebRTC.

Video: every decoded frame is counted; frames due at the target FPS (by media time) are *sampled* into a
latest-frame-wins slot, so a slow analyser drops old frames (counted) instead of building a backlog.
Audio: never dropped; a bounded queue applies backpressure instead.
With a virtual clock (as-fast-as-possible replay) each fed frame is processed before the call returns, so the
output depends only on the input.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import av
from aiortc.mediastreams import MediaStreamError
from pydantic import ValidationError

from pipelines import telemetry
from pipelines.clock import ArrivalDelay, Clock, Timer
from pipelines.errors import ApiError, describe_validation_error, parse_json
from pipelines.protocol import (
    ConfigRequest,
    Detections,
    Error,
    Event,
    Hello,
    MediaCounts,
    Metrics,
    Ping,
    Pong,
    ServerInfo,
    ServerMessage,
    SessionConfig,
    SessionConfigPatch,
    VideoSessionConfig,
    client_message_adapter,
)
from pipelines.video.scene import SceneState, known_in_view, trusted

log = logging.getLogger(__name__)

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

    def attach(self, pipeline: SessionPipeline) -> None:
        """Called once: the analyser sends its messages through the pipeline and reads its scene."""

    async def process(self, frame: av.AudioFrame, pts: float) -> None: ...

    async def close(self) -> None: ...


class TimelineSink(Protocol):
    """The seam the timeline recorder (``pipelines.timeline``) plugs into: it stores events, transcripts, replies
    and scene summaries, keeps recent video and writes event clips; it never blocks."""

    def attach(self, pipeline: SessionPipeline) -> None: ...

    def on_video_frame(self, frame: av.VideoFrame, pts: float) -> None: ...

    def on_analyzed(self, frame: av.VideoFrame, pts: float, objects: list[dict[str, Any]],
                    events: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any], str | None]]:
        """Every event to send (the analyser's plus the recorder's own), each with its stored id."""

    def on_message(self, message: ServerMessage) -> None: ...

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

    def attach(self, pipeline: SessionPipeline) -> None:
        return None

    async def process(self, frame: av.AudioFrame, pts: float) -> None:
        return None

    async def close(self) -> None:
        return None


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


class _TrackTime:
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


class SessionPipeline:
    def __init__(
        self,
        session_id: str,
        *,
        origin: str,
        clock: Clock,
        emit: MessageSink,
        config: SessionConfig,
        server_version: str,
        video_analyzer: VideoAnalyzer | None = None,
        audio_analyzer: AudioAnalyzer | None = None,
        metrics_interval_s: float = 1.0,
        audio_queue_frames: int = 500,
        timeline: TimelineSink | None = None,
    ) -> None:
        self.session_id = session_id
        self.origin = origin
        self.clock = clock
        self.config = config
        self.counts = MediaCounts()
        self.scene = SceneState()
        self.tracks: list[str] = []
        self._emit = emit
        self._server_version = server_version
        self._video_analyzer = video_analyzer or CountingOnlyVideoAnalyzer()
        self._audio_analyzer = audio_analyzer or CountingOnlyAudioAnalyzer()
        self._sampler = FpsSampler(config.video.target_fps)
        self._slot = LatestFrameSlot()
        self._audio_queue: asyncio.Queue[tuple[av.AudioFrame, float]] = asyncio.Queue(audio_queue_frames)
        self._video_time = _TrackTime()
        self._audio_time = _TrackTime()
        self._video_delay = ArrivalDelay()
        self._audio_delay = ArrivalDelay()
        self._metrics_interval_s = metrics_interval_s
        self._metrics_timer: Timer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._video_failure: str | None = None  # code of the ongoing video analysis failure, if any
        self._metrics = telemetry.PipelineMetrics(origin)
        self._video_analyzer.configure(config.video)
        self._audio_analyzer.attach(self)
        self.timeline = timeline
        if timeline is not None:
            timeline.attach(self)

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        if not self.clock.virtual:
            self._tasks.append(asyncio.create_task(self._video_worker(), name=f"{self.session_id}:video"))
            self._tasks.append(asyncio.create_task(self._audio_worker(), name=f"{self.session_id}:audio"))
        self._schedule_metrics()

    async def close(self) -> None:
        """Stop workers, flush queued audio (never dropped), and send the final counts."""
        if self._closed:
            return
        self._closed = True
        if self._metrics_timer is not None:
            self._metrics_timer.cancel()
        if self._tasks:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._audio_queue.join(), timeout=5.0)
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        await self._audio_analyzer.close()
        if self.timeline is not None:
            await self.timeline.close()
        self.send(Metrics, media=self.counts.model_copy(deep=True))
        # The analysers and the recorder hold this pipeline and its sink holds the session: nothing is sent after
        # close, so cut those cycles and an ended session is freed now, not by a full collection (issue 23).
        self.timeline = None
        self._audio_analyzer = CountingOnlyAudioAnalyzer()
        self._emit = _closed_sink

    # ------------------------------------------------------------------ messages

    def make(self, message_type: type[ServerMessage], **fields: Any) -> ServerMessage:
        return message_type(session=self.session_id, ts=self.clock.now(), **fields)

    def send(self, message_type: type[ServerMessage], **fields: Any) -> None:
        try:
            message = self.make(message_type, **fields)
        except Exception:
            log.exception("could not build %s message", message_type.__name__)
            return
        self.emit(message)

    def emit(self, message: ServerMessage) -> None:
        telemetry.MESSAGES_SENT.labels(type=message.type).inc()  # type: ignore[attr-defined]
        if self.timeline is not None:
            self.timeline.on_message(message)
        self._emit(message)

    def hello(self) -> None:
        self.emit(self.hello_message())

    def hello_message(self) -> ServerMessage:
        return self.make(
            Hello,
            server=ServerInfo(version=self._server_version),
            config=self.config,
            tracks=list(self.tracks),
            models={"video": self._video_analyzer.name, "audio": self._audio_analyzer.name},
        )

    def error(self, code: str, message: str, ref: str | None = None) -> None:
        self.emit(self.error_message(code, message, ref))

    def error_message(self, code: str, message: str, ref: str | None = None) -> ServerMessage:
        telemetry.ERRORS.labels(code=code).inc()
        return self.make(Error, code=code, message=message, ref=ref)

    def apply_config(self, patch: SessionConfigPatch) -> SessionConfig:
        self.config = self.config.merged(patch)
        if self._sampler.target_fps != self.config.video.target_fps:
            self._sampler.retarget(self.config.video.target_fps)
        self._video_analyzer.configure(self.config.video)
        self.send(Event, name="config", data=self.config.model_dump())
        return self.config

    def _schedule_metrics(self) -> None:
        def tick() -> None:  # a fresh closure each time: one that named itself would be a cycle (issue 23)
            if self._closed:
                return
            self.send(Metrics, media=self.counts.model_copy(deep=True))
            self._schedule_metrics()

        self._metrics_timer = self.clock.call_later(self._metrics_interval_s, tick)

    # ------------------------------------------------------------------ media in

    @property
    def audio_analyzer(self) -> AudioAnalyzer:
        return self._audio_analyzer

    @property
    def audio_output(self) -> Any:
        """The reply audio track, when the audio analyser speaks back."""
        return self._audio_analyzer.output_track

    def play_audio_locally(self) -> None:
        """For sources with no peer to send reply audio to: consume it in real time, as a loudspeaker would,
        so that playback timing (barge-in, echo gating) means the same as in a WebRTC session."""
        track = self.audio_output
        if track is None or self.clock.virtual:
            return

        # an idle reply track waits for speech rather than pacing silence (nobody hears it; issue 24)
        receive = getattr(track, "recv_audible", track.recv)

        async def drain() -> None:
            with contextlib.suppress(MediaStreamError):
                while True:
                    await receive()

        self._tasks.append(asyncio.create_task(drain(), name=f"{self.session_id}:playout"))

    @property
    def media_delay_s(self) -> float:
        """How far behind its media this session's input runs now (live tracks; 0 until frames arrive)."""
        return max(self._video_delay.seconds, self._audio_delay.seconds)

    def add_track(self, kind: str) -> None:
        if kind not in self.tracks:
            self.tracks.append(kind)

    def _arrived(self, frame: av.VideoFrame | av.AudioFrame, track: _TrackTime, delay: ArrivalDelay) -> float:
        """A frame's media time on its track. Either track moves a virtual clock (as-fast-as-possible replay) to it;
        with the wall clock, how late the frame came is measured instead (``media_delay_s``)."""
        pts = track.of(frame)
        if self.clock.virtual:
            self.clock.advance_to(pts)  # type: ignore[attr-defined]
        else:
            delay.observe(pts, time.monotonic())
        return pts

    async def feed_video(self, frame: av.VideoFrame) -> None:
        if self._closed:
            return
        pts = self._arrived(frame, self._video_time, self._video_delay)
        self.counts.video.frames_in += 1
        self._metrics.frames_in.inc()
        if self.timeline is not None:
            self.timeline.on_video_frame(frame, pts)
        if not self._sampler.due(pts):
            return
        self.counts.video.frames_sampled += 1
        self._metrics.frames_sampled.inc()
        sampled = SampledFrame(frame, pts, time.perf_counter())
        if self.clock.virtual:
            await self._analyze(sampled)
        elif self._slot.put(sampled):
            self.counts.video.frames_dropped += 1
            self._metrics.frames_dropped.inc()

    async def feed_audio(self, frame: av.AudioFrame) -> None:
        if self._closed:
            return
        pts = self._arrived(frame, self._audio_time, self._audio_delay)
        self.counts.audio.frames_in += 1
        self.counts.audio.samples_in += frame.samples
        self.counts.audio.seconds_in = round(self.counts.audio.samples_in / (frame.sample_rate or 1), 6)
        self._metrics.audio_frames_in.inc()
        if self.clock.virtual:
            await self._audio_analyzer.process(frame, pts)
        else:
            await self._audio_queue.put((frame, pts))  # backpressure, never a drop

    async def drain_audio(self) -> None:
        """Wait until every audio frame fed so far has been processed."""
        await self._audio_queue.join()

    # ------------------------------------------------------------------ workers

    async def _analyze(self, sampled: SampledFrame) -> None:
        queue_ms = (time.perf_counter() - sampled.sampled_at) * 1000.0
        try:
            result = await self._video_analyzer.analyze(sampled)
        except Exception as error:  # a bad frame or model failure must not end the session
            # A remote detector that is down (code detector_unavailable) fails every frame: say so once per outage.
            code = getattr(error, "code", None) or "analysis_failed"
            if code == "analysis_failed":
                log.exception("video analysis failed in %s", self.session_id)
            if code == "analysis_failed" or code != self._video_failure:
                self.error(code, f"video analysis failed: {error}")
            self._video_failure = code
            return
        if isinstance(result, NoMotion):  # no detector call: says nothing of an ongoing failure's end
            self.counts.video.frames_no_motion += 1
            self._metrics.frames_no_motion.inc()
            self._sample_at(None)
            return
        self._video_failure = None
        self.counts.video.frames_analyzed += 1
        self._metrics.frames_analyzed.inc()
        if result is None:
            return
        self._sample_at(result.sample_fps)
        pts = round(sampled.pts, 6)
        self.send(
            Detections,
            pts=pts,
            width=result.width,
            height=result.height,
            objects=result.objects,
            inference_ms=round(result.inference_ms, 3),
            queue_ms=0.0 if self.clock.virtual else round(queue_ms, 3),
            model=result.model,
        )
        events: list[tuple[str, dict[str, Any], str | None]] = [(name, data, None) for name, data in result.events]
        if self.timeline is not None:
            events = self.timeline.on_analyzed(sampled.frame, pts, result.objects, result.events)
        for name, data, event_id in events:
            telemetry.SCENE_EVENTS.labels(name=name).inc()
            self.send(Event, pts=pts, name=name, data=data, id=event_id)
        self.scene.update(
            labels=[o["label"] for o in trusted(result.objects)], pts=pts, ts=self.clock.now(), model=result.model,
            zone_occupancy=result.zone_occupancy, line_counts=result.line_counts,
            events=[{"name": name, **data} for name, data, _ in events], known=known_in_view(result.objects),
        )
        if not self.clock.virtual:
            self._metrics.end_to_end_ms.observe((time.perf_counter() - sampled.sampled_at) * 1000.0)

    def _sample_at(self, fps: float | None) -> None:
        """Sample at the analyser's asked rate (a motion boost), or back at the target rate."""
        rate = fps or self.config.video.target_fps
        if rate != self._sampler.target_fps:
            self._sampler.retarget(rate)

    async def _video_worker(self) -> None:
        while True:
            await self._analyze(await self._slot.get())

    async def _audio_worker(self) -> None:
        while True:
            frame, pts = await self._audio_queue.get()
            try:
                await self._audio_analyzer.process(frame, pts)
            except Exception as error:
                log.exception("audio processing failed in %s", self.session_id)
                self.error("analysis_failed", f"audio processing failed: {error}")
            finally:
                self._audio_queue.task_done()


def _closed_sink(message: ServerMessage) -> None:
    log.debug("message after close dropped: %s", message.type)  # type: ignore[attr-defined]


async def pump_track(track: Any, feed: Callable[[Any], Awaitable[None]]) -> None:
    """Receive frames from an aiortc track until it ends, feeding each into the pipeline."""
    while True:
        try:
            frame = await track.recv()
        except MediaStreamError:
            return
        await feed(frame)


def handle_client_message(
    pipeline: SessionPipeline,
    raw: str | bytes,
    max_bytes: int,
    reply: MessageSink | None = None,
) -> None:
    """Apply one client message; anything wrong is answered with an ``error`` message, never raised.

    This is the one entry point for client messages (data channel and WebSocket): *any* failure (bad JSON,
    nesting deep enough to hit the recursion limit, lone surrogates, a bug) becomes an ``error`` message, so
    one message can never end a session or a subscriber.
    ``reply`` receives errors and pongs (the sender only); config changes are announced to everyone.
    """
    answer = reply or pipeline.emit
    try:
        _apply_client_message(pipeline, raw, max_bytes, answer)
    except Exception as error:  # RecursionError, MemoryError's cousins, bugs: answered, never raised
        log.warning("client message failed in %s: %r", pipeline.session_id, error)
        try:
            answer(pipeline.error_message("invalid_message", f"message rejected: {type(error).__name__}"))
        except Exception:
            log.exception("could not answer a failed client message in %s", pipeline.session_id)


def _message_size(raw: str | bytes) -> int:
    return len(raw.encode("utf-8", "surrogatepass")) if isinstance(raw, str) else len(raw)


def _apply_client_message(pipeline: SessionPipeline, raw: str | bytes, max_bytes: int, answer: MessageSink) -> None:
    size = _message_size(raw)
    if size > max_bytes:
        answer(pipeline.error_message("message_too_large", f"message of {size} bytes exceeds {max_bytes}"))
        return
    try:
        data = parse_json(raw, what="message")
    except ApiError as error:
        answer(pipeline.error_message(error.code, error.message))
        return
    ref = data.get("type") if isinstance(data, dict) and isinstance(data.get("type"), str) else None
    try:
        message = client_message_adapter.validate_python(data)
    except ValidationError as error:
        details = describe_validation_error(error, root="<message>", limit=1000)
        answer(pipeline.error_message("invalid_message", details, ref=ref))
        return
    except RecursionError:
        answer(pipeline.error_message("invalid_message", "message nested too deeply", ref=ref))
        return
    if isinstance(message, Ping):
        answer(pipeline.make(Pong, id=message.id))
    elif isinstance(message, ConfigRequest):
        pipeline.apply_config(SessionConfigPatch.model_validate(message.model_dump(exclude={"v", "type"})))
