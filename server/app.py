"""The aiohttp application: middlewares, routes, dashboard files, and an orderly shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from pipelines.errors import ApiError
from server.allocator import limit_arenas
from server.cluster.routes import mount_cluster
from server.config import Settings
from server.engines import ModelPool
from server.grpc_api.service import mount_grpc
from server.http.auth import auth_middleware
from server.http.errors import json_errors
from server.http.probes import mount_probes
from server.http.routes import route_table
from server.http.serve import serve_forever
from server.media.ice import restrict_host_addresses
from server.media.sessions import Analyzers
from server.metrics import watch_event_loop
from server.services import Services, build_services
from server.state import (
    AUDIO,
    CHAT_SERVICE,
    CLUSTER,
    DISCONNECTS,
    ENGINES,
    GRPC_SERVER,
    MEMORY,
    REDIS,
    SESSIONS,
    SETTINGS,
    SOURCES,
    TIMELINE,
    V1_INGRESS,
    WEBSOCKETS,
)
from server.store.events import mount_events
from server.store.memory import mount_memory
from server.v1.audio import mount_audio
from server.v1.chat import mount_chat
from server.v1.ingress import mount_v1_ingress

log = logging.getLogger(__name__)


async def _index(request: web.Request) -> web.StreamResponse:
    index = request.app[SETTINGS].server.web_root / "index.html"
    if not index.is_file():
        raise ApiError("not_found", "dashboard files not found (server.web_root)")
    return web.FileResponse(index)


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
    mount_events(app, services.timeline)  # the timeline store every session and source records into
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
