"""The composition root: the aiohttp application (middlewares, the one route table, dashboard files, and an
orderly shutdown), built from the ``Services`` of ``server.services``. Only this module gathers the front-ends'
routes and sets the keys the app holds: the front-ends and the plumbing under them import none of it."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pipelines.errors import ApiError
from server.allocator import limit_arenas
from server.cluster.node import CLUSTER
from server.cluster.routes import CLUSTER_ROUTES, in_cluster_mode, mount_cluster
from server.config import Settings
from server.engines import ENGINES, Analyzers, ModelPool
from server.grpc_api.service import GRPC_SERVER, mount_grpc
from server.http.auth import auth_middleware
from server.http.errors import json_errors
from server.http.openapi import build_openapi
from server.http.probes import Health, Liveness, Readiness, healthz, livez, mount_probes, readyz
from server.http.route import Route
from server.http.serve import serve_forever
from server.mcp_api.service import MCP_SERVICE, mcp_routes, mount_mcp
from server.media.ice import restrict_host_addresses
from server.media.routes import MEDIA_ROUTES
from server.media.sessions import SESSIONS
from server.media.sources import SOURCES
from server.metrics import watch_event_loop
from server.mqtt.publisher import MQTT_PUBLISHER, mount_mqtt
from server.records.events import EVENT_ROUTES
from server.records.faces import FACE_ROUTES
from server.records.memory import MEMORY_ROUTES
from server.services import Services, build_services, mount_memory
from server.state import MEMORY, REDIS, SETTINGS, TIMELINE, WEBSOCKETS
from server.v1.audio import mount_audio
from server.v1.audio_services import AUDIO
from server.v1.chat import mount_chat
from server.v1.chat_service import CHAT_SERVICE
from server.v1.disconnects import DISCONNECTS
from server.v1.ingress import V1_INGRESS, mount_v1_ingress
from server.v1.routes import v1_routes

log = logging.getLogger(__name__)


async def _index(request: web.Request) -> web.StreamResponse:
    index = request.app[SETTINGS].server.web_root / "index.html"
    if not index.is_file():
        raise ApiError("not_found", "dashboard files not found (server.web_root)")
    return web.FileResponse(index)


async def metrics(request: web.Request) -> web.Response:
    return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(build_openapi(route_table(request.app[SETTINGS])))


HTTP_ROUTES: tuple[Route, ...] = (
    Route("GET", "/healthz", healthz, "Liveness probe (no token); with the token also version, sessions, sources",
          response=Health),
    Route("GET", "/livez", livez, "Liveness probe (no token; reveals nothing)", response=Liveness),
    Route("GET", "/readyz", readyz, "Readiness probe (no token): 200 ready, 503 starting; per-model states only "
          "with the token", response=Readiness, errors=(503,)),
    Route("GET", "/metrics", metrics, "Prometheus metrics", errors=(401,), content_type=CONTENT_TYPE_LATEST),
    Route("GET", "/openapi.json", openapi, "This document", errors=(401,)),
)


def route_table(settings: Settings) -> tuple[Route, ...]:
    """Every route the app serves, as configured, gathered from the packages that own them; it feeds both the
    router and ``/openapi.json``: live media's (in cluster mode with the cluster's answers for the whole cluster,
    and ``/api/cluster/*``), the probes, metrics and this document, the events timeline, faces, memory, and the
    enabled ``/v1`` endpoints and ``/mcp``."""
    media = MEDIA_ROUTES
    if settings.cluster.redis_url is not None:
        media = (*in_cluster_mode(media), *CLUSTER_ROUTES)
    return (*media, *HTTP_ROUTES, *EVENT_ROUTES, *FACE_ROUTES, *MEMORY_ROUTES, *v1_routes(settings),
            *mcp_routes(settings.mcp.enabled))


def create_app(settings: Settings, analyzers: Analyzers | None = None,
               models: ModelPool | None = None) -> web.Application:
    """``analyzers`` defaults to the models the config names (loaded here, once). ``models``: loaded weights to
    take from (and add to) instead of the app's own pool; its owner closes it (tests share one between apps)."""
    restrict_host_addresses(settings.webrtc.host_addresses)
    services = build_services(settings, analyzers, models)
    engines = services.engines
    token = settings.auth.token.get_secret_value() if settings.auth.token else None
    app = web.Application(
        middlewares=[json_errors, auth_middleware(token)],
        client_max_size=settings.server.max_body_bytes,
    )
    _hold(app, services)
    for route in route_table(settings):  # every front-end's routes, as configured: one table, also /openapi.json's
        app.router.add_route(route.method, route.path, route.handler)
        if route.head:
            app.router.add_route("HEAD", route.path, route.handler)
    if services.redis is not None:
        app.on_cleanup.append(_close_redis)
    mount_v1_ingress(app, services.ingress)  # every /v1/ route: API keys or token, rate limit, size limits
    app.on_cleanup.append(_timeline_closer(services))  # the timeline store and its clip writers, closed on cleanup
    mount_mcp(app, services.mcp)  # the MCP SDK's session manager, running from start-up to cleanup
    mount_mqtt(app, services.mqtt)  # closed after the timeline, whose last committed entries it still sends
    mount_chat(app, settings, services.chat, services.disconnects)  # the chat service (shared with gRPC)
    app.router.add_get("/", _index)
    if settings.server.web_root.is_dir():
        app.router.add_static("/static/", settings.server.web_root)
    mount_audio(app, settings, services.audio)  # transcription jobs resumed; speech
    mount_cluster(app, services.cluster)  # before our shutdown, so SIGTERM hands sources over first
    # the memory index, fed by the stored timeline
    mount_memory(app, settings, services.memory, services.timeline.store if services.timeline.stored else None)

    async def shutdown(app: web.Application) -> None:
        for ws in list(app[WEBSOCKETS]):
            await ws.close(code=1001, message=b"server shutting down")
        await app[SOURCES].stop_all()
        await app[SESSIONS].close_all()
        await engines.close_session_models()

    async def release_llm(app: web.Application) -> None:
        await engines.close()

    app.on_shutdown.append(shutdown)
    app.on_cleanup.append(release_llm)
    app.cleanup_ctx.append(_watch_event_loop)
    mount_grpc(app, services.grpc)
    mount_probes(app)  # last: ready once every start-up step above has run
    app.on_startup.append(_start_load_monitor)  # after start-up's own work, which is not the sessions' load
    app.on_cleanup.append(_stop_load_monitor)
    return app


def _hold(app: web.Application, services: Services) -> None:
    """Every key the app holds, set once, here."""
    app[SETTINGS] = services.settings
    app[ENGINES] = services.engines
    app[SESSIONS] = services.sessions
    app[SOURCES] = services.sources
    app[WEBSOCKETS] = set()
    app[V1_INGRESS] = services.ingress
    app[CHAT_SERVICE] = services.chat
    app[DISCONNECTS] = services.disconnects
    if services.redis is not None:
        app[REDIS] = services.redis
    if services.timeline.stored:
        app[TIMELINE] = services.timeline.store
    if services.memory is not None:
        app[MEMORY] = services.memory
    if services.audio is not None:
        app[AUDIO] = services.audio
    if services.cluster is not None:
        app[CLUSTER] = services.cluster
    if services.grpc is not None:
        app[GRPC_SERVER] = services.grpc
    if services.mqtt is not None:
        app[MQTT_PUBLISHER] = services.mqtt
    if services.mcp is not None:
        app[MCP_SERVICE] = services.mcp


def _timeline_closer(services: Services) -> Callable[[web.Application], Awaitable[None]]:
    async def close(app: web.Application) -> None:
        await services.timeline.close()

    return close


async def _close_redis(app: web.Application) -> None:
    await app[REDIS].aclose()


async def _start_load_monitor(app: web.Application) -> None:
    app[SESSIONS].start_load_monitor()


async def _stop_load_monitor(app: web.Application) -> None:
    await app[SESSIONS].load.close()


async def _watch_event_loop(app: web.Application) -> AsyncIterator[None]:
    task = asyncio.create_task(watch_event_loop(), name="event-loop-lag")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run(settings: Settings, analyzers: Analyzers | None = None) -> None:
    limit_arenas(settings.server.malloc_arena_max)  # before the server starts its threads
    app = create_app(settings, analyzers)
    log.info("Vigil listening on http://%s:%s/", settings.server.host, settings.server.port)
    serve_forever(app, settings.server.host, settings.server.port,
                  shutdown_timeout=settings.server.shutdown_timeout_s, print=lambda text: print(text, flush=True),
                  event_loop=settings.server.event_loop)
