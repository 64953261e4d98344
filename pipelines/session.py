"""One session's media pipeline: frames in, messages out. Pure asyncio; knows nothing of HTTP or WebRTC.

Video: every decoded frame is counted; frames due at the target FPS (by media time) are *sampled* into a
latest-frame-wins slot, so a slow analyser drops old frames (counted) instead of building a backlog.
Audio: never dropped; a bounded queue applies backpressure instead.
With a virtual clock (as-fast-as-possible replay) each fed frame is processed before the call returns, so the
output depends only on the input.
Messages: all leave through one exit, where the timeline recorder sees each once (an analysed frame's
``detections`` and events as one batch, so the events go out with their stored ids) before the peer does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import av
from aiortc.mediastreams import MediaStreamError

from pipelines import telemetry
from pipelines.clock import ArrivalDelay, Clock, Timer
from pipelines.ports import (
    AnalysedFrame,
    AudioAnalyzer,
    CountingOnlyAudioAnalyzer,
    CountingOnlyVideoAnalyzer,
    MessageSink,
    NoMotion,
    SampledFrame,
    TimelineSink,
    VideoAnalyzer,
)
from pipelines.protocol import (
    Detections,
    Error,
    Event,
    Hello,
    MediaCounts,
    Metrics,
    ServerInfo,
    ServerMessage,
    SessionConfig,
    SessionConfigPatch,
)
from pipelines.sampling import FpsSampler, LatestFrameSlot, TrackTime
from pipelines.scene import SceneState, known_in_view, trusted

log = logging.getLogger(__name__)




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
        self._video_time = TrackTime()
        self._audio_time = TrackTime()
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
        # close, so cut those cycles and an ended session is freed now, not by a full collection.
        self.timeline = None
        self._audio_analyzer = CountingOnlyAudioAnalyzer()
        self._emit = _closed_sink

    # ------------------------------------------------------------------ messages

    def make(self, message_type: type[ServerMessage], **fields: Any) -> ServerMessage:
        return message_type(session=self.session_id, ts=self.clock.now(), **fields)

    def _build(self, message_type: type[ServerMessage], **fields: Any) -> ServerMessage | None:
        try:
            return self.make(message_type, **fields)
        except Exception:
            log.exception("could not build %s message", message_type.__name__)
            return None

    def send(self, message_type: type[ServerMessage], **fields: Any) -> None:
        message = self._build(message_type, **fields)
        if message is not None:
            self.emit(message)

    def emit(self, message: ServerMessage) -> None:
        self._send_all([message])

    def _send_all(self, messages: list[ServerMessage], analysed: AnalysedFrame | None = None) -> list[ServerMessage]:
        """The one way out: each message passes the recorder once, then goes to the peer; returns what was sent."""
        if self.timeline is not None:
            messages = self.timeline.on_outgoing(messages, analysed)
        for message in messages:
            telemetry.MESSAGES_SENT.labels(type=message.type).inc()  # type: ignore[attr-defined]
            self._emit(message)
        return messages

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
        def tick() -> None:  # a fresh closure each time: one that named itself would be a cycle
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

        # an idle reply track waits for speech rather than pacing silence (nobody hears it)
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

    def _arrived(self, frame: av.VideoFrame | av.AudioFrame, track: TrackTime, delay: ArrivalDelay) -> float:
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
        if not self.config.video.detect or not self._sampler.due(pts):
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
            self.counts.video.frames_failed += 1
            self._metrics.frames_failed.inc()
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
        detections = self._build(
            Detections,
            pts=pts,
            width=result.width,
            height=result.height,
            objects=result.objects,
            inference_ms=round(result.inference_ms, 3),
            queue_ms=0.0 if self.clock.virtual else round(queue_ms, 3),
            model=result.model,
        )
        built = [self._build(Event, pts=pts, name=name, data=data) for name, data in result.events]
        batch = [message for message in (detections, *built) if message is not None]
        sent = self._send_all(batch, AnalysedFrame(sampled.frame, pts, result.objects))
        events = [message for message in sent if isinstance(message, Event)]
        for event in events:
            telemetry.SCENE_EVENTS.labels(name=event.name).inc()
        self.scene.update(
            labels=[o["label"] for o in trusted(result.objects)], pts=pts, ts=self.clock.now(), model=result.model,
            zone_occupancy=result.zone_occupancy, line_counts=result.line_counts,
            events=[{"name": event.name, **event.data} for event in events], known=known_in_view(result.objects),
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
