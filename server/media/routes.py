"""Live media's HTTP routes: WebRTC signaling (``POST /offer``), ``/api/sessions`` and ``/api/sources`` (RTSP
cameras and files run on the server; their results over a WebSocket). In cluster mode ``server.cluster.routes``
answers some of these for the whole cluster."""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Literal

from aiohttp import WSMsgType, web
from pydantic import BaseModel, ConfigDict, Field

from pipelines.client_messages import handle_client_message
from pipelines.errors import ApiError
from pipelines.protocol import MediaCounts, SessionConfig, SessionConfigPatch
from server.http.errors import read_json_body
from server.http.route import Route
from server.media.sessions import SESSIONS, SessionRegistry, serialize
from server.media.sources import (
    SOURCES,
    MediaPathError,
    PathOutsideMediaRoot,
    SourceManager,
    SourceRequest,
    Subscriber,
)
from server.state import SETTINGS, WEBSOCKETS

log = logging.getLogger(__name__)

MAX_SDP_CHARS = 100_000


# ---------------------------------------------------------------- bodies (also the OpenAPI schemas)


class OfferRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    sdp: str = Field(min_length=1, max_length=MAX_SDP_CHARS)
    type: Literal["offer"]
    options: SessionConfigPatch | None = Field(None, description="Per-session settings, e.g. video.target_fps.")


class OfferResponse(BaseModel):
    sdp: str
    type: Literal["answer"] = "answer"
    session_id: str


class SessionInfo(BaseModel):
    id: str
    created_at: float
    connection_state: str
    tracks: list[str]
    config: SessionConfig
    counts: MediaCounts
    node: str | None = Field(None, description="Cluster mode: the node the session runs on.")


class SourceInfo(BaseModel):
    id: str
    kind: Literal["rtsp", "file"]
    location: str
    name: str | None
    state: str
    state_detail: dict[str, Any]
    realtime: bool
    loop: bool
    created_at: float
    subscribers: int
    config: SessionConfig
    counts: MediaCounts
    node: str | None = Field(None, description="Cluster mode: the node running the source ('' while none does).")


_PARTIAL = "Cluster mode: true when the cluster's Redis cannot be reached and only this node's are listed."


class SessionList(BaseModel):
    sessions: list[SessionInfo]
    partial: bool = Field(False, description=_PARTIAL)


class SourceList(BaseModel):
    sources: list[SourceInfo]
    partial: bool = Field(False, description=_PARTIAL)


def _json(model: BaseModel, status: int = 200) -> web.Response:
    return web.json_response(text=model.model_dump_json(), status=status)


# ---------------------------------------------------------------- handlers


def _sessions(request: web.Request) -> SessionRegistry:
    return request.app[SESSIONS]


def _sources(request: web.Request) -> SourceManager:
    return request.app[SOURCES]


async def offer(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    await _sessions(request).admit_offer(request.remote or "unknown")  # before the body is even read
    body: OfferRequest = await read_json_body(request, OfferRequest)
    config = settings.session_defaults()
    if body.options is not None:
        config = config.merged(body.options)
    session, answer = await _sessions(request).open(body.sdp, config)
    return _json(OfferResponse(sdp=answer.sdp, session_id=session.id))


async def list_sessions(request: web.Request) -> web.Response:
    infos = [SessionInfo.model_validate(s.describe()) for s in _sessions(request).sessions.values()]
    return _json(SessionList(sessions=infos))


def _session_or_404(request: web.Request):
    session = _sessions(request).get(request.match_info["session_id"])
    if session is None:
        raise ApiError("not_found", "no such session")
    return session


async def get_session(request: web.Request) -> web.Response:
    return _json(SessionInfo.model_validate(_session_or_404(request).describe()))


async def delete_session(request: web.Request) -> web.Response:
    session = _session_or_404(request)
    await _sessions(request).close(session.id)
    return web.Response(status=204)


class Scene(BaseModel):
    counts: dict[str, int] = Field(description="Objects per label in the last analysed frame.")
    zones: dict[str, list[int]] = Field(description="Zone name -> track ids inside it now.")
    lines: dict[str, dict[str, int]] = Field(description="Line name -> crossings {'in': n, 'out': n}.")
    recent_events: list[dict[str, Any]]
    pts: float | None
    ts: float | None
    last_change_ts: float | None
    model: str | None
    known: list[str] = Field(default_factory=list, description=(
        "Who and which is in view: enrolled people by name (video.faces), vehicles by plate (video.plates)."))
    summary: str = Field(description="The scene in one paragraph, as the voice loop's LLM sees it.")


def _scene(pipeline: Any) -> web.Response:
    return _json(Scene(**pipeline.scene.as_dict(), summary=pipeline.scene.summary()))


async def _apply_config(request: web.Request, pipeline: Any) -> web.Response:
    patch: SessionConfigPatch = await read_json_body(request, SessionConfigPatch)
    return _json(pipeline.apply_config(patch))


async def get_session_scene(request: web.Request) -> web.Response:
    return _scene(_session_or_404(request).pipeline)


async def set_session_config(request: web.Request) -> web.Response:
    return await _apply_config(request, _session_or_404(request).pipeline)


async def get_source_scene(request: web.Request) -> web.Response:
    return _scene(_source_or_404(request).pipeline)


async def set_source_config(request: web.Request) -> web.Response:
    source = _source_or_404(request)
    patch: SessionConfigPatch = await read_json_body(request, SessionConfigPatch)
    return _json(_sources(request).configure(source, patch))


async def create_source(request: web.Request) -> web.Response:
    body: SourceRequest = await read_json_body(request, SourceRequest)
    try:
        source = _sources(request).start(body)
    except PathOutsideMediaRoot as error:
        raise ApiError("invalid_path", str(error), param="path", kind="forbidden") from None
    except MediaPathError as error:
        raise ApiError("invalid_path", str(error), param="path") from None
    return _json(SourceInfo.model_validate(source.describe()), status=201)


async def list_sources(request: web.Request) -> web.Response:
    infos = [SourceInfo.model_validate(s.describe()) for s in _sources(request).sources.values()]
    return _json(SourceList(sources=infos))


def _source_or_404(request: web.Request):
    source = _sources(request).get(request.match_info["source_id"])
    if source is None:
        raise ApiError("not_found", "no such source")
    return source


async def get_source(request: web.Request) -> web.Response:
    return _json(SourceInfo.model_validate(_source_or_404(request).describe()))


async def delete_source(request: web.Request) -> web.Response:
    source = _source_or_404(request)
    await _sources(request).stop(source.id)
    return web.Response(status=204)


async def source_results(request: web.Request) -> web.WebSocketResponse:
    """The source's messages as WebSocket text frames; client messages (config, ping) are accepted too."""
    source = _source_or_404(request)
    settings = request.app[SETTINGS]
    limit = settings.sources.max_subscribers
    if len(source.subscribers) >= limit:
        raise ApiError("too_many_subscribers", f"this source already has {limit} subscribers "
                       "(sources.max_subscribers)", kind="too_many_requests")  # 429, before the upgrade
    subscriber = Subscriber(settings.sessions.outbound_queue_messages)
    subscriber.offer(serialize(source.pipeline.hello_message()))
    if source.last_state is not None:
        subscriber.offer(serialize(source.last_state))
    source.subscribers.add(subscriber)  # before the first await: parallel upgrades cannot overshoot the limit
    # The frame limit is above the message limit, so an oversized message is answered with an `error` message
    # (handle_client_message) instead of aiohttp closing the socket with 1009; only far larger frames close it.
    ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=4 * settings.webrtc.max_message_bytes)
    try:
        await ws.prepare(request)
    except BaseException:
        source.subscribers.discard(subscriber)
        raise
    request.app[WEBSOCKETS].add(ws)

    async def forward() -> None:
        while True:
            text = await subscriber.queue.get()
            if text is None:  # the source was stopped
                await ws.close(code=1000, message=b"source stopped")
                return
            await ws.send_str(text)
            if subscriber.overflowed and subscriber.queue.empty():
                await ws.close(code=1008, message=b"slow consumer: message queue full")
                return

    sender = asyncio.create_task(forward(), name=f"{source.id}:ws")
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                handle_client_message(source.pipeline, msg.data, settings.webrtc.max_message_bytes,
                                      reply=lambda m: subscriber.offer(serialize(m)))
            elif msg.type == WSMsgType.BINARY:
                subscriber.offer(serialize(source.pipeline.error_message("invalid_message", "send text frames")))
    finally:
        source.subscribers.discard(subscriber)
        request.app[WEBSOCKETS].discard(ws)
        sender.cancel()
        await ws.close()
    return ws


MEDIA_ROUTES: tuple[Route, ...] = (
    Route("POST", "/offer", offer, "Answer a WebRTC offer and open a session", OfferRequest, OfferResponse,
          errors=(400, 401, 413, 415, 422, 429)),
    Route("GET", "/api/sessions", list_sessions, "List sessions", response=SessionList, errors=(401,)),
    Route("GET", "/api/sessions/{session_id}", get_session, "One session", response=SessionInfo,
          errors=(401, 404)),
    Route("DELETE", "/api/sessions/{session_id}", delete_session, "Close a session and free what it held",
          status=204, errors=(401, 404)),
    Route("GET", "/api/sessions/{session_id}/scene", get_session_scene, "What the session's camera sees now",
          response=Scene, errors=(401, 404)),
    Route("POST", "/api/sessions/{session_id}/config", set_session_config,
          "Change the session's config at run time (e.g. video.target_fps, zones, lines)", SessionConfigPatch,
          SessionConfig, errors=(401, 404, 413, 415, 422)),
    Route("POST", "/api/sources", create_source, "Start a server-side source (RTSP URL or media file)",
          SourceRequest, SourceInfo, status=201, errors=(400, 401, 403, 413, 415, 422, 429)),
    Route("GET", "/api/sources", list_sources, "List server-side sources", response=SourceList,
          errors=(401,)),
    Route("GET", "/api/sources/{source_id}", get_source, "One source", response=SourceInfo, errors=(401, 404)),
    Route("DELETE", "/api/sources/{source_id}", delete_source, "Stop a source (in any state)", status=204,
          errors=(401, 404)),
    Route("GET", "/api/sources/{source_id}/scene", get_source_scene, "What the source's camera sees now",
          response=Scene, errors=(401, 404)),
    Route("POST", "/api/sources/{source_id}/config", set_source_config, "Change the source's config at run time",
          SessionConfigPatch, SessionConfig, errors=(401, 404, 413, 415, 422)),
    Route("GET", "/api/sources/{source_id}/results", source_results,
          "WebSocket: the source's protocol messages (upgrade required)", status=101, errors=(401, 404, 429)),
)
