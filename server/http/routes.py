"""The app's one route table, gathered from the packages that own the routes (``route_table``): it feeds both
the router and ``/openapi.json``. Here too: the routes of the HTTP plumbing itself (probes, metrics, this
document)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from server.cluster.routes import CLUSTER_ROUTES, in_cluster_mode
from server.config import Settings
from server.http.openapi import build_openapi
from server.http.probes import Health, Liveness, Readiness, healthz, livez, readyz
from server.http.route import Route
from server.media.routes import MEDIA_ROUTES
from server.state import SETTINGS
from server.store.events import EVENT_ROUTES
from server.store.faces import FACE_ROUTES
from server.store.memory import MEMORY_ROUTES
from server.v1.routes import v1_routes


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
    """Every route the app serves, as configured: live media's (in cluster mode with the cluster's answers for
    the whole cluster, and ``/api/cluster/*``), the probes, metrics and this document, the events timeline,
    memory, and the enabled ``/v1`` endpoints."""
    media = MEDIA_ROUTES
    if settings.cluster.redis_url is not None:
        media = (*in_cluster_mode(media), *CLUSTER_ROUTES)
    return (*media, *HTTP_ROUTES, *EVENT_ROUTES, *FACE_ROUTES, *MEMORY_ROUTES, *v1_routes(settings))
