"""Server-side media sources read with PyAV: RTSP cameras (reconnecting) and recorded files (replayed).

Demuxing and decoding run on one dedicated thread per source; each frame is handed to the pipeline on the
event loop and the thread waits until it is accepted, so the pipeline's backpressure reaches the reader
(audio is never dropped; in as-fast-as-possible mode nothing is dropped at all).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal, Protocol, runtime_checkable

import av

from pipelines.ports import MediaInput
from pipelines.sources.urls import redact_text, redact_url, url_secrets

log = logging.getLogger(__name__)


class SourceState(StrEnum):
    CONNECTING = "connecting"
    LIVE = "live"
    RECONNECTING = "reconnecting"
    ENDED = "ended"  # a file reached its end (and does not loop)
    FAILED = "failed"  # a file that cannot be opened or decoded, or a camera error that retrying cannot fix
    STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ReaderSettings:
    rtsp_transport: Literal["tcp", "udp"] = "tcp"
    open_timeout_s: float = 10.0
    read_timeout_s: float = 5.0
    reconnect_initial_s: float = 0.5
    reconnect_max_s: float = 30.0


StateCallback = Callable[[SourceState, dict[str, Any]], None]

# Camera errors that retrying cannot fix: an unknown protocol, a refused login, a path the server does not
# have, a malformed URL. Anything else (refused connection, timeout, I/O error, a dropped stream) may heal:
# those are retried with a capped backoff.
PERMANENT_FFMPEG_ERRORS: tuple[type[BaseException], ...] = (
    av.error.ProtocolNotFoundError,
    av.error.HTTPClientError,  # 4xx: 400 bad request, 401 unauthorized, 403 forbidden, 404 not found
    av.error.OptionNotFoundError,
)


def is_permanent(error: BaseException) -> bool:
    """True for an open error no retry can fix; a ValueError outside FFmpeg is a refusal of the URL itself."""
    if isinstance(error, av.error.FFmpegError):
        return isinstance(error, PERMANENT_FFMPEG_ERRORS)
    return isinstance(error, ValueError)


@runtime_checkable
class PacketSink(Protocol):
    """Receives the video stream's encoded packets on the reader thread (the timeline's ring buffer)."""

    def stream_opened(self, stream: av.VideoStream, offset: float) -> None: ...

    def packet(self, packet: av.Packet) -> None: ...

    def stream_ended(self) -> None: ...


class _Stopped(Exception):
    pass


def _in_thread(fn: Callable[[], Any], name: str) -> asyncio.Future[Any]:
    """Run ``fn`` on its own daemon thread (the shared executor is too small for long-lived readers)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any = None, error: BaseException | None = None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def body() -> None:
        try:
            result = fn()
        except BaseException as error:  # handed to the awaiting coroutine
            outcome: tuple[Any, BaseException | None] = (None, error)
        else:
            outcome = (result, None)
        # The loop may be gone when a reader outlives shutdown (a killed server): nobody awaits it any more.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=body, name=name, daemon=True).start()
    return future


class ContainerSource:
    """Reads one URL or file into a pipeline until stopped.

    ``realtime``: paced by timestamps (files) or by the camera (RTSP). Otherwise as fast as the pipeline
    accepts frames, which with a virtual clock makes two runs over one file identical.
    """

    def __init__(
        self,
        location: str,
        pipeline: MediaInput,
        *,
        kind: Literal["rtsp", "file"],
        realtime: bool = True,
        loop: bool = False,
        settings: ReaderSettings | None = None,
        on_state: StateCallback | None = None,
        on_progress: Callable[[float, float | None], None] | None = None,
        packet_sink: PacketSink | None = None,
    ) -> None:
        self.location = location  # as FFmpeg gets it: may hold a password, so never shown or logged
        self.shown = redact_url(location)
        self._secrets = url_secrets(location)
        self.kind = kind
        self.realtime = realtime
        self.loop = loop
        self.settings = settings or ReaderSettings()
        self.state = SourceState.CONNECTING
        self.state_detail: dict[str, Any] = {}
        self._pipeline = pipeline
        self._on_state = on_state
        self._on_progress = on_progress
        self._packet_sink = packet_sink
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------ control

    def start(self) -> asyncio.Task[None]:
        self._task = asyncio.create_task(self.run(), name=f"source:{self.shown}")
        return self._task

    async def stop(self) -> None:
        """Stop in any state; returns promptly (a blocked read ends by itself within its timeout)."""
        self._stop.set()
        if self._task is not None and not self._task.done():
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self._set_state(SourceState.STOPPED)

    async def wait(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)

    # ------------------------------------------------------------------ main loop

    async def run(self) -> None:
        event_loop = asyncio.get_running_loop()
        attempt = 0
        loop_offset = 0.0
        while not self._stop.is_set():
            self._set_state(SourceState.CONNECTING if attempt == 0 else SourceState.RECONNECTING,
                            attempt=attempt)
            try:
                container = await _in_thread(self._open, f"open:{self.kind}")
            except Exception as error:
                if self.kind == "file" or is_permanent(error):
                    self._set_state(SourceState.FAILED, reason=f"cannot open: {error}")
                    return
                attempt += 1
                await self._backoff(attempt, f"cannot connect: {error}")
                continue
            attempt = 0
            for stream in [*container.streams.video[:1], *container.streams.audio[:1]]:
                self._pipeline.add_track(stream.type)
            self._set_state(SourceState.LIVE)
            try:
                loop_offset = await _in_thread(
                    lambda c=container, o=loop_offset: self._read(c, o, event_loop), f"read:{self.kind}"
                )
                reason = "end of stream"
            except _Stopped:
                return
            except Exception as error:
                if self.kind == "file":
                    self._set_state(SourceState.FAILED, reason=f"decode error: {error}")
                    return
                reason = f"stream lost: {error}"
            if self.kind == "file":
                if self.loop and not self._stop.is_set():
                    continue
                self._set_state(SourceState.ENDED)
                return
            attempt += 1
            await self._backoff(attempt, reason)

    async def _backoff(self, attempt: int, reason: str) -> None:
        delay = min(self.settings.reconnect_initial_s * 2 ** (attempt - 1), self.settings.reconnect_max_s)
        self._set_state(SourceState.RECONNECTING, attempt=attempt, reason=reason, retry_in_s=round(delay, 3))
        await asyncio.sleep(delay)

    def _set_state(self, state: SourceState, **detail: Any) -> None:
        # Every reason (FFmpeg's messages quote the URL) is redacted here, the one way out to states, events
        # and logs.
        detail = {key: redact_text(value, self._secrets) if isinstance(value, str) else value
                  for key, value in detail.items()}
        if state == self.state and detail == self.state_detail:
            return
        if self.state in (SourceState.STOPPED,):
            return  # terminal
        self.state, self.state_detail = state, detail
        log.info("source %s: %s %s", self.shown, state, detail or "")
        if self._on_state is not None:
            self._on_state(state, detail)

    # ------------------------------------------------------------------ reader thread

    def _open(self) -> av.container.InputContainer:
        if self.kind == "rtsp":
            return av.open(
                self.location,
                # A short probe: PyAV otherwise spends ~2 s analysing a live stream on every (re)connect.
                options={"rtsp_transport": self.settings.rtsp_transport, "analyzeduration": "500000"},
                timeout=(self.settings.open_timeout_s, self.settings.read_timeout_s),
            )
        return av.open(self.location)

    def _read(self, container: av.container.InputContainer, offset: float, loop: asyncio.AbstractEventLoop
              ) -> float:
        """Demux and decode until the end; returns the media time reached (the next loop's offset)."""
        streams = [*container.streams.video[:1], *container.streams.audio[:1]]
        if not streams:
            container.close()
            raise ValueError("no audio or video stream")
        for stream in streams:
            stream.thread_type = "AUTO"
        duration = float(container.duration / av.time_base) if container.duration else None
        wall_start: float | None = None
        media_start: float | None = None
        reached = offset
        sink = self._packet_sink if container.streams.video else None
        if sink is not None:
            sink.stream_opened(container.streams.video[0], offset)
        try:
            for packet in container.demux(*streams):
                if sink is not None and packet.stream.type == "video":
                    sink.packet(packet)
                for frame in packet.decode():
                    if self._stop.is_set():
                        raise _Stopped
                    seconds = float(frame.pts * frame.time_base) if frame.pts is not None else None
                    if seconds is not None:
                        if offset:
                            frame.pts = round((seconds + offset) / frame.time_base)
                        reached = max(reached, seconds + offset)
                        if self.realtime and self.kind == "file":
                            if wall_start is None or media_start is None:
                                wall_start, media_start = time.monotonic(), seconds
                            delay = wall_start + (seconds - media_start) - time.monotonic()
                            if delay > 0 and self._stop.wait(delay):
                                raise _Stopped
                    feed = (self._pipeline.feed_video if isinstance(frame, av.VideoFrame)
                            else self._pipeline.feed_audio)
                    self._handover(asyncio.run_coroutine_threadsafe(feed(frame), loop))
                    if self._on_progress is not None and seconds is not None:
                        self._on_progress(seconds, duration)
        finally:
            if sink is not None:
                sink.stream_ended()
            container.close()
        return reached + 1e-3

    def _handover(self, future: concurrent.futures.Future[None]) -> None:
        while True:
            try:
                future.result(timeout=0.2)
                return
            except concurrent.futures.TimeoutError:
                if self._stop.is_set():
                    future.cancel()
                    raise _Stopped from None
