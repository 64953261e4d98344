"""The aiohttp application: middlewares, routes, dashboard files, and an orderly shutdown."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from aiohttp import web

from pipelines.errors import ApiError
from server.allocator import limit_arenas
from server.cluster.node import setup_cluster
from server.config import Settings
from server.engines import ENGINES, Engines, ModelPool
from server.grpc_api.service import setup_grpc
from server.http.auth import auth_middleware
from server.http.errors import json_errors
from server.http.probes import setup_probes
from server.http.routes import ROUTES
from server.http.serve import serve_forever
from server.media.ice import restrict_host_addresses
from server.media.sessions import Analyzers, SessionRegistry
from server.media.sources import SourceManager
from server.metrics import watch_event_loop
from server.state import SESSIONS, SETTINGS, SOURCES, WEBSOCKETS
from server.store.events import setup_events_api
from server.store.memory import setup_memory
from server.v1.audio import setup_audio_api
from server.v1.chat import setup_openai_api
from server.v1.ingress import setup_v1_ingress
from server.v1.shared_redis import setup_redis

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
    engines = Engines(settings, analyzers, models)
    analyzers = engines.analyzers  # loads the session models now (seconds); the rest on first use
    token = settings.auth.token.get_secret_value() if settings.auth.token else None
    app = web.Application(
        middlewares=[json_errors, auth_middleware(token)],
        client_max_size=settings.server.max_body_bytes,
    )
    app[SETTINGS] = settings
    app[ENGINES] = engines
    app[SESSIONS] = SessionRegistry(settings, analyzers)
    app[SOURCES] = SourceManager(settings, analyzers)
    app[WEBSOCKETS] = set()
    for route in ROUTES:
        app.router.add_route(route.method, route.path, route.handler)
    redis = setup_redis(app, settings)
    setup_v1_ingress(app, settings, redis)  # every /v1/ route: API keys or token, rate limit, size limits
    setup_events_api(app, settings)  # /api/events and the timeline store every session and source records into
    setup_openai_api(app, settings, redis, engines)  # the chat service (shared with gRPC) and its /v1 routes
    app.router.add_get("/", _index)
    if settings.server.web_root.is_dir():
        app.router.add_static("/static/", settings.server.web_root)
    setup_audio_api(app, settings, engines)  # /v1/audio/...: transcriptions, transcription jobs, speech
    setup_cluster(app, settings)  # cluster.redis_url: before our shutdown, so SIGTERM hands sources over first
    setup_memory(app, settings, analyzers)  # /api/search, /api/collections; taps sessions, voice recall, chat docs

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
    setup_grpc(app, settings, engines)
    setup_probes(app)  # last: ready once every start-up step above has run
    app.on_startup.append(_start_load_monitor)  # after start-up's own work, which is not the sessions' load
    app.on_cleanup.append(_stop_load_monitor)
    return app


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
