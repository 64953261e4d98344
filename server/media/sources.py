"""Server-side sources (RTSP cameras, files under the media root): the same pipeline as a WebRTC session,
with results fanned out to WebSocket subscribers."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipelines.clock import Clock, VirtualClock, WallClock
from pipelines.errors import ApiError
from pipelines.protocol import Event, ServerMessage, SessionConfigPatch
from pipelines.session import SessionPipeline
from pipelines.sources.container import ContainerSource, PacketSink, ReaderSettings, SourceState
from pipelines.sources.urls import normalize_source_url, redact_url
from server.config import Settings
from server.engines import Analyzers
from server.media.sessions import PipelineHost, TimelineFactory, serialize
from server.metrics import SOURCE_STATES
from server.metrics import SOURCES as RUNNING_SOURCES
from server.mqtt.switches import SwitchStore

log = logging.getLogger(__name__)


class SourceRequest(BaseModel):
    """Body of ``POST /api/sources``: exactly one of ``url`` (rtsp/rtsps) or ``path`` (under the media root)."""

    model_config = ConfigDict(extra="forbid")

    url: str | None = Field(None, max_length=2048, description="rtsp:// or rtsps:// camera URL (surrounding "
                            "whitespace is removed and the scheme lower-cased; it needs a host).")
    path: str | None = Field(None, max_length=4096, description="File path relative to sources.media_root.")
    name: str | None = Field(None, max_length=200)
    realtime: bool = Field(True, description="Files: paced by timestamps (false: as fast as possible).")
    loop: bool = Field(False, description="Files: start again at the end.")
    options: SessionConfigPatch | None = None

    @model_validator(mode="after")
    def _one_location(self) -> SourceRequest:
        if (self.url is None) == (self.path is None):
            raise ValueError("give exactly one of 'url' or 'path'")
        if self.url is not None:
            self.url = normalize_source_url(self.url)  # raises InvalidSourceUrl (a ValueError: a 422)
        return self


class MediaPathError(ValueError):
    pass


class PathOutsideMediaRoot(MediaPathError):
    """The path exists but lies outside ``sources.media_root`` (a 403, not a 400)."""


def resolve_media_path(media_root: Path, requested: str) -> Path:
    """The real file ``requested`` names inside ``media_root``; anything that escapes it is refused."""
    root = media_root.resolve()
    candidate = Path(requested)
    if "\x00" in requested:
        raise MediaPathError("path contains a NUL byte")
    full = (candidate if candidate.is_absolute() else root / candidate)
    try:
        real = full.resolve(strict=True)  # follows symlinks, so a link pointing outside is caught below
    except (FileNotFoundError, NotADirectoryError):
        raise MediaPathError(f"no such file under the media root: {requested}") from None
    except (OSError, RuntimeError) as error:
        raise MediaPathError(f"cannot resolve path: {error}") from None
    if not real.is_relative_to(root):
        raise PathOutsideMediaRoot("path is outside the media root")
    if not real.is_file():
        raise MediaPathError("path is not a regular file")
    return real


class Subscriber:
    """One WebSocket watcher: a bounded queue; a consumer too slow to keep up is disconnected, not starved."""

    def __init__(self, capacity: int) -> None:
        self.queue: asyncio.Queue[str | None] = asyncio.Queue(capacity)
        self.overflowed = False

    def offer(self, text: str) -> None:
        if self.overflowed:
            return
        try:
            self.queue.put_nowait(text)
        except asyncio.QueueFull:
            self.overflowed = True

    def close(self) -> None:
        if not self.overflowed:
            try:
                self.queue.put_nowait(None)
            except asyncio.QueueFull:
                self.overflowed = True


@dataclass
class ManagedSource:
    id: str
    kind: Literal["rtsp", "file"]
    location: str  # shown to users: URL without password, or the path relative to the media root
    name: str | None
    pipeline: SessionPipeline
    reader: ContainerSource | None = None
    created_at: float = field(default_factory=time.time)
    subscribers: set[Subscriber] = field(default_factory=set)
    last_state: ServerMessage | None = None

    def publish(self, message: ServerMessage) -> None:
        text = serialize(message)
        for subscriber in list(self.subscribers):
            subscriber.offer(text)

    def describe(self) -> dict[str, Any]:
        assert self.reader is not None
        return {
            "id": self.id,
            "kind": self.kind,
            "location": self.location,
            "name": self.name,
            "state": self.reader.state.value,
            "state_detail": self.reader.state_detail,
            "realtime": self.reader.realtime,
            "loop": self.reader.loop,
            "created_at": self.created_at,
            "subscribers": len(self.subscribers),
            "config": self.pipeline.config.model_dump(),
            "counts": self.pipeline.counts.model_dump(),
        }


class SourceManager(PipelineHost):
    def __init__(self, settings: Settings, analyzers: Analyzers | None = None,
                 timeline: TimelineFactory | None = None, switches: SwitchStore | None = None) -> None:
        super().__init__(settings, analyzers, timeline)
        self.switches = switches  # detection switched over MQTT, kept by source name across restarts
        self.sources: dict[str, ManagedSource] = {}
        # Called with (source id, new state) on every state change (the cluster republishes its listing then).
        self.state_listeners: list[Callable[[str, SourceState], None]] = []

    def __len__(self) -> int:
        return len(self.sources)

    def get(self, source_id: str) -> ManagedSource | None:
        return self.sources.get(source_id)

    def reader_settings(self) -> ReaderSettings:
        fields = {f.name for f in dataclasses.fields(ReaderSettings)}
        return ReaderSettings(**self.settings.sources.model_dump(include=fields))

    def start(self, request: SourceRequest, source_id: str | None = None) -> ManagedSource:
        """Validate and start a source; raises MediaPathError or ApiError ``too_many_sources``. ``source_id``: the
        id the cluster gave it (the same on whichever node runs it)."""
        if len(self.sources) >= self.settings.sessions.max_sources:
            raise ApiError("too_many_sources", f"source limit reached ({self.settings.sessions.max_sources})")
        if request.path is not None:
            root = self.settings.sources.media_root
            real = resolve_media_path(root, request.path)
            kind: Literal["rtsp", "file"] = "file"
            target, shown = str(real), str(real.relative_to(root.resolve()))
        else:
            assert request.url is not None
            kind, target, shown = "rtsp", request.url, redact_url(request.url)
        source_id = source_id or uuid.uuid4().hex[:12]
        config = self.settings.session_defaults()
        if request.options is not None:
            config = config.merged(request.options)
        kept = self.switches.detect(request.name or source_id) if self.switches is not None else None
        if kept is not None:  # the switch was flipped last: it wins over the request's options
            config = config.merged(SessionConfigPatch.model_validate({"video": {"detect": kept}}))
        holder: dict[str, ManagedSource] = {}
        # As-fast-as-possible replay runs on media time, so two runs over one file give identical results.
        clock: Clock = VirtualClock() if kind == "file" and not request.realtime else WallClock()
        timeline = self.timeline(kind, request.name) if self.timeline else None
        pipeline = self.analyzers.pipeline(self.settings, source_id, origin=kind, clock=clock,
                                           emit=lambda message: holder["source"].publish(message), config=config,
                                           timeline=timeline)
        source = ManagedSource(source_id, kind, shown, request.name, pipeline)
        holder["source"] = source

        def on_state(state: SourceState, detail: dict[str, Any]) -> None:
            SOURCE_STATES.labels(state=state.value).inc()
            message = pipeline.make(Event, name="source.state", data={"state": state.value, **detail})
            source.last_state = message
            pipeline.emit(message)
            for listener in self.state_listeners:
                listener(source.id, state)

        source.reader = ContainerSource(
            target, pipeline, kind=kind, realtime=request.realtime, loop=request.loop,
            settings=self.reader_settings(), on_state=on_state,
            packet_sink=timeline if isinstance(timeline, PacketSink) else None,
        )
        self.sources[source_id] = source
        RUNNING_SOURCES.set(len(self.sources))
        pipeline.start()
        pipeline.play_audio_locally()
        source.reader.start()
        log.info("source %s started: %s %s", source_id, kind, shown)
        return source

    def configure(self, source: ManagedSource, patch: SessionConfigPatch) -> Any:
        """Apply a config patch (``POST /api/sources/{id}/config``); a change of ``video.detect`` is the detection
        switch MQTT's ``detect/set`` flips, so it is kept across restarts the same way."""
        config = source.pipeline.apply_config(patch)
        detect = patch.video.detect if patch.video is not None else None
        if detect is not None and self.switches is not None:
            self.switches.set_detect(source.name or source.id, detect)
        return config

    async def stop(self, source_id: str) -> bool:
        source = self.sources.pop(source_id, None)
        if source is None:
            return False
        RUNNING_SOURCES.set(len(self.sources))
        if source.reader is not None:
            await source.reader.stop()
        await source.pipeline.close()
        for subscriber in list(source.subscribers):
            subscriber.close()
        log.info("source %s stopped", source_id)
        return True

    async def stop_all(self) -> None:
        await asyncio.gather(*(self.stop(sid) for sid in list(self.sources)))


SOURCES = web.AppKey("sources", SourceManager)
