"""WebRTC sessions: one peer connection, its tracks pumped into one pipeline, results on the data channel."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection, RTCSessionDescription
from aiortc.rtcdatachannel import RTCDataChannel
from aiortc.sdp import SessionDescription

from pipelines.client_messages import handle_client_message
from pipelines.clock import WallClock
from pipelines.errors import ApiError
from pipelines.ports import TimelineSink
from pipelines.protocol import ServerMessage, SessionConfig
from pipelines.serving.ratelimit import InProcessRateLimiter
from pipelines.session import SessionPipeline, pump_track
from server.allocator import HeapTrimmer
from server.config import Settings
from server.engines import Analyzers
from server.media.admission import LoopLoadMonitor
from server.media.jitter import release_backlog
from server.media.rtc_release import release_peer_connection
from server.metrics import SESSIONS as OPEN_SESSIONS

log = logging.getLogger(__name__)

RESULTS_LABEL = "results"

# Makes a session's or source's timeline recorder, given (origin, name): server.services.recorder_factory.
TimelineFactory = Callable[[str, str | None], TimelineSink]


def check_connectable_offer(sdp: str) -> SessionDescription:
    """Refuse (400) an offer no peer could ever connect with, before it takes a session slot: it must parse,
    and its data-channel section needs a port, ICE credentials and a DTLS fingerprint."""
    try:
        parsed = SessionDescription.parse(sdp)
    except Exception as error:  # aiortc's parser raises ValueError, IndexError, ... on garbage
        raise ApiError("invalid_sdp", f"cannot parse the SDP: {error!r}"[:500]) from None
    if not sdp.lstrip().startswith("v=0") or not parsed.media:
        raise ApiError("invalid_sdp", "the SDP has no media sections")
    channels = [media for media in parsed.media if media.kind == "application"]
    if not channels:
        raise ApiError("no_data_channel",
                       f"the offer has no data channel: create one labelled '{RESULTS_LABEL}' first")
    bundled = {str(mid) for group in parsed.group if group.semantic == "BUNDLE" for mid in group.items}
    for media in channels:
        missing = [what for what, present in (
            ("a port", media.port != 0 or media.rtp.muxId in bundled),  # port 0 = rejected, unless bundle-only
            ("an SCTP port", media.sctp_port is not None or bool(media.sctpmap)),
            ("ICE credentials (ice-ufrag, ice-pwd)", bool(media.ice and media.ice.usernameFragment
                                                          and media.ice.password)),
            ("a DTLS fingerprint", bool(media.dtls and media.dtls.fingerprints)),
        ) if not present]
        if missing:
            raise ApiError("not_connectable",
                           "the offer's data-channel section lacks " + ", ".join(missing))
    return parsed


def serialize(message: ServerMessage) -> str:
    """The message as JSON text that always encodes to UTF-8: a string a client sent back to us (a ping id,
    a ``ref``) may hold a lone surrogate, which pydantic's serialiser refuses; then every non-ASCII character
    is written as a JSON ``\\u`` escape instead."""
    try:
        return message.model_dump_json(exclude_none=True)
    except ValueError:  # PydanticSerializationError: surrogates not allowed
        return json.dumps(message.model_dump(mode="json", exclude_none=True), ensure_ascii=True)


@dataclass
class WebRTCSession:
    id: str
    pc: RTCPeerConnection
    pipeline: SessionPipeline
    max_message_bytes: int
    created_at: float = field(default_factory=time.time)
    channel: RTCDataChannel | None = None
    pending: deque[str] = field(default_factory=lambda: deque(maxlen=1000))
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    closed: bool = False

    def emit(self, message: ServerMessage) -> None:
        text = serialize(message)
        if self.channel is not None and self.channel.readyState == "open":
            try:
                self.channel.send(text)
            except Exception as error:  # the channel closing under us: the session's own close handles it
                log.warning("session %s: cannot send on the data channel: %r", self.id, error)
        else:  # before the channel opens: kept (bounded) and flushed on open
            self.pending.append(text)

    def attach_channel(self, channel: RTCDataChannel) -> None:
        self.channel = channel

        @channel.on("message")
        def on_message(raw: str | bytes) -> None:
            # handle_client_message never raises: an exception escaping here would end the peer connection
            handle_client_message(self.pipeline, raw, self.max_message_bytes)

        self.pipeline.hello()
        while self.pending and channel.readyState == "open":
            channel.send(self.pending.popleft())

    def release(self) -> None:
        """After close: drop what ties the ended session's objects into reference cycles (finished tasks keep
        their frames, the peer connection and channel keep our callbacks), so refcounting frees them now rather
        than a full garbage collection, much later."""
        self.tasks.clear()
        self.pending.clear()
        if self.channel is not None:
            self.channel.remove_all_listeners()
        release_peer_connection(self.pc)

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "created_at": self.created_at,
            "connection_state": self.pc.connectionState,
            "tracks": list(self.pipeline.tracks),
            "config": self.pipeline.config.model_dump(),
            "counts": self.pipeline.counts.model_dump(),
        }


class PipelineHost:
    """What a session's or a source's pipeline is built from: the settings, the analysers and the timeline's
    recorder factory (all given at construction: ``server.services.build_services``)."""

    def __init__(self, settings: Settings, analyzers: Analyzers | None = None,
                 timeline: TimelineFactory | None = None) -> None:
        self.settings = settings
        self.analyzers = analyzers or Analyzers()
        self.timeline = timeline


class SessionRegistry(PipelineHost):
    def __init__(self, settings: Settings, analyzers: Analyzers | None = None,
                 timeline: TimelineFactory | None = None) -> None:
        super().__init__(settings, analyzers, timeline)
        self.sessions: dict[str, WebRTCSession] = {}
        self._reserved = 0
        self._offer_rate = InProcessRateLimiter()
        self.load = LoopLoadMonitor()
        self.heap = HeapTrimmer()  # hands an ended session's freed pages back to the OS

    def __len__(self) -> int:
        return len(self.sessions)

    def get(self, session_id: str) -> WebRTCSession | None:
        return self.sessions.get(session_id)

    def _rtc_configuration(self) -> RTCConfiguration:
        servers = [
            RTCIceServer(
                urls=s.urls,
                username=s.username,
                credential=s.credential.get_secret_value() if s.credential else None,
            )
            for s in self.settings.webrtc.ice_servers
        ]
        return RTCConfiguration(iceServers=servers)

    def _young(self) -> int:
        """Sessions too new to show in the measured load (offers being answered count too)."""
        since = time.time() - self.load.window_s
        return self._reserved + sum(1 for session in self.sessions.values() if session.created_at > since)

    def start_load_monitor(self) -> None:
        self.load.start(settled=lambda: len(self.sessions) + self._reserved - self._young(),
                        open_sessions=lambda: len(self.sessions) + self._reserved,
                        media_delay_s=lambda: max((s.pipeline.media_delay_s for s in self.sessions.values()),
                                                  default=0.0))

    @property
    def occupied(self) -> int:
        """Open sessions plus offers being answered (each holds its slot from before its first await)."""
        return len(self.sessions) + self._reserved

    async def admit_offer(self, client: str) -> None:
        """The per-client offer rate limit (``webrtc.offer_rate_limit``); raises ApiError ``too_many_offers``."""
        limit = self.settings.webrtc.offer_rate_limit
        if limit is None:
            return
        decision = await self._offer_rate.hit(client, limit.requests, limit.window_s)
        if not decision.allowed:
            raise ApiError("too_many_offers",
                           f"more than {limit.requests} offers in {limit.window_s:g} s from this client",
                           retry_after_s=decision.retry_after_s)

    async def open(self, sdp: str, config: SessionConfig) -> tuple[WebRTCSession, RTCSessionDescription]:
        """Answer an offer; raises ApiError (never leaves a half-open session or a held slot behind).

        The offer is checked and its slot reserved before the first await, so concurrent offers cannot
        overshoot ``sessions.max_sessions``."""
        check_connectable_offer(sdp)
        limits = self.settings.sessions
        if self.occupied >= limits.max_sessions:
            raise ApiError("too_many_sessions", f"session limit reached ({limits.max_sessions})")
        if limits.max_starting_sessions is not None and self._young() >= limits.max_starting_sessions:
            # A burst would be admitted before its load or its lateness could show: let them in a few at a time.
            raise ApiError("server_busy", f"{limits.max_starting_sessions} sessions are still starting; try again "
                           "when they are measured", retry_after_s=self.load.window_s)
        if refusal := self.load.refusal(self.occupied, limits.max_loop_load, limits.max_media_delay_s,
                                        limits.busy_retry_after_s):
            raise ApiError("server_busy", refusal.message, retry_after_s=refusal.retry_after_s)
        self._reserved += 1
        try:
            return await self._open(sdp, config)
        finally:
            self._reserved -= 1

    async def _open(self, sdp: str, config: SessionConfig) -> tuple[WebRTCSession, RTCSessionDescription]:
        session_id = uuid.uuid4().hex[:12]
        pc = RTCPeerConnection(self._rtc_configuration())
        holder: dict[str, WebRTCSession] = {}
        pipeline = self.analyzers.pipeline(self.settings, session_id, origin="webrtc", clock=WallClock(),
                                           emit=lambda message: holder["session"].emit(message), config=config,
                                           timeline=self.timeline("webrtc", None) if self.timeline else None)
        session = WebRTCSession(session_id, pc, pipeline, self.settings.webrtc.max_message_bytes)
        holder["session"] = session

        @pc.on("track")
        def on_track(track: Any) -> None:
            if track.kind not in ("audio", "video"):
                return
            pipeline.add_track(track.kind)
            release_backlog(pc, track)  # no standing backlog in the jitter buffer
            if track.kind == "audio" and pipeline.audio_output is not None:
                pc.addTrack(pipeline.audio_output)  # replies go back on the same (sendrecv) transceiver
            feed = pipeline.feed_video if track.kind == "video" else pipeline.feed_audio
            session.tasks.append(asyncio.create_task(pump_track(track, feed), name=f"{session_id}:pump"))

        @pc.on("datachannel")
        def on_datachannel(channel: RTCDataChannel) -> None:
            if channel.label == RESULTS_LABEL and session.channel is None:
                session.attach_channel(channel)

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                await self.close(session_id)

        try:
            await pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type="offer"))
            answer = await pc.createAnswer()
            await pc.setLocalDescription(answer)
        except asyncio.CancelledError:  # the offer's handler was cancelled (e.g. ICE gathering outlived it)
            await asyncio.shield(self._discard_unopened(session))  # its sockets and tasks go with it
            raise
        except Exception as error:  # aiortc raises ValueError, KeyError, ... on bad SDP
            await self._discard_unopened(session)
            raise ApiError("invalid_sdp", f"cannot use this offer: {error!r}"[:500]) from None

        self.sessions[session_id] = session
        OPEN_SESSIONS.set(len(self.sessions))
        pipeline.start()
        session.tasks.append(asyncio.create_task(self._expire_unconnected(session), name=f"{session_id}:expiry"))
        log.info("session %s opened (tracks: %s)", session_id, pipeline.tracks)
        return session, pc.localDescription

    @staticmethod
    async def _discard_unopened(session: WebRTCSession) -> None:
        """Free what an offer that was never answered holds: its tasks, peer connection and pipeline."""
        for task in session.tasks:
            task.cancel()
        with contextlib.suppress(Exception):  # close() itself can raise on a bad offer (BUNDLE, mids)
            await session.pc.close()
        with contextlib.suppress(Exception):
            await session.pipeline.close()
        session.release()

    async def _expire_unconnected(self, session: WebRTCSession) -> None:
        await asyncio.sleep(self.settings.webrtc.connect_timeout_s)
        if session.pc.connectionState != "connected":
            log.info("session %s never connected; closing", session.id)
            await self.close(session.id)

    async def close(self, session_id: str) -> bool:
        session = self.sessions.pop(session_id, None)
        if session is None or session.closed:
            return False
        session.closed = True
        OPEN_SESSIONS.set(len(self.sessions))
        current = asyncio.current_task()
        for task in session.tasks:
            if task is not current:
                task.cancel()
        await asyncio.gather(*(t for t in session.tasks if t is not current), return_exceptions=True)
        await session.pipeline.close()
        with contextlib.suppress(Exception):
            await session.pc.close()
        session.release()
        self.heap.request()
        log.info("session %s closed", session_id)
        return True

    async def close_all(self) -> None:
        await asyncio.gather(*(self.close(sid) for sid in list(self.sessions)))


SESSIONS = web.AppKey("sessions", SessionRegistry)
