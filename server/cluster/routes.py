"""The cluster's HTTP side: ``/api/cluster/*``, and in cluster mode the rows of live media's route table that
answer for the whole cluster (``in_cluster_mode``); everything about a source that runs here, and every WebRTC
session, is still served by live media's handlers. The node itself: ``server.cluster.node``."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, Field

from server.cluster.node import CLUSTER, ClusterNode
from server.http.errors import ApiError, read_json_body
from server.http.route import Route
from server.media.routes import SessionInfo, SessionList, SourceInfo, SourceList
from server.media.sessions import SESSIONS
from server.media.sources import SOURCES, MediaPathError, PathOutsideMediaRoot, SourceRequest

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _node(request: web.Request) -> ClusterNode:
    return request.app[CLUSTER]


def _json(model: Any, status: int = 200) -> web.Response:
    return web.json_response(text=model.model_dump_json(), status=status)


async def create_source(request: web.Request) -> web.Response:
    body: SourceRequest = await read_json_body(request, SourceRequest)
    try:
        info = await _node(request).create(body)
    except PathOutsideMediaRoot as error:
        raise ApiError("invalid_path", str(error), param="path", kind="forbidden") from None
    except MediaPathError as error:
        raise ApiError("invalid_path", str(error), param="path") from None
    return _json(SourceInfo.model_validate(info), 201)


async def list_sources(request: web.Request) -> web.Response:
    sources, partial = await _node(request).list_sources()
    return _json(SourceList(sources=[SourceInfo.model_validate(s) for s in sources], partial=partial))


async def list_sessions(request: web.Request) -> web.Response:
    sessions, partial = await _node(request).list_sessions()
    return _json(SessionList(sessions=[SessionInfo.model_validate(s) for s in sessions], partial=partial))


async def delete_source(request: web.Request) -> web.Response:
    if not await _node(request).delete(request.match_info["source_id"]):
        raise ApiError("not_found", "no such source")
    return web.Response(status=204)


async def get_source(request: web.Request) -> web.Response:
    node, source_id = _node(request), request.match_info["source_id"]
    local = request.app[SOURCES].get(source_id)
    if local is not None:
        return _json(SourceInfo.model_validate(local.describe() | {"node": node.node_id}))
    info, _ = await _elsewhere(node, source_id)
    return _json(SourceInfo.model_validate(info))


async def _elsewhere(node: ClusterNode, source_id: str) -> tuple[dict[str, Any], Any]:
    found = await node.find_source(source_id)
    if found is None:
        raise ApiError("not_found", "no such source")
    return found


def _here_or_elsewhere(handler: Handler) -> Handler:
    """A source's other endpoints: served here when the source runs here, else a pointer to its node."""

    @functools.wraps(handler)  # its name is the route's operationId in /openapi.json
    async def serve(request: web.Request) -> web.StreamResponse:
        source_id = request.match_info["source_id"]
        if request.app[SOURCES].get(source_id) is not None:
            return await handler(request)
        _, owner = await _elsewhere(_node(request), source_id)
        where = f"node {owner.id} at {owner.url}" if owner else "no node yet (being placed or taken over)"
        raise ApiError("source_on_other_node", f"source {source_id} runs on {where}: ask that node")

    return serve


def _session_anywhere(handler: Handler) -> Handler:
    """A session not here may run on another node: its listing comes from there."""

    @functools.wraps(handler)
    async def serve(request: web.Request) -> web.StreamResponse:
        session_id = request.match_info["session_id"]
        if request.app[SESSIONS].get(session_id) is None:
            sessions, _ = await _node(request).list_sessions()
            for info in sessions:
                if info["id"] == session_id:
                    return _json(SessionInfo.model_validate(info))
        return await handler(request)

    return serve


_FOR_THE_CLUSTER: dict[tuple[str, str], Handler] = {
    ("POST", "/api/sources"): create_source,
    ("GET", "/api/sources"): list_sources,
    ("GET", "/api/sessions"): list_sessions,
    ("GET", "/api/sources/{source_id}"): get_source,
    ("DELETE", "/api/sources/{source_id}"): delete_source,
}


def in_cluster_mode(routes: tuple[Route, ...]) -> tuple[Route, ...]:
    """Live media's route table with the cluster's handlers where the answer is the whole cluster's (same paths,
    bodies and responses, so ``/openapi.json`` documents them as they are)."""

    def handler(route: Route) -> Handler:
        if (route.method, route.path) in _FOR_THE_CLUSTER:
            return _FOR_THE_CLUSTER[route.method, route.path]
        if route.path.startswith("/api/sources/{source_id}/"):
            return _here_or_elsewhere(route.handler)
        if route.method == "GET" and route.path == "/api/sessions/{session_id}":
            return _session_anywhere(route.handler)
        return route.handler

    return tuple(dataclasses.replace(route, handler=handler(route)) for route in routes)


class NodeListing(BaseModel):
    id: str
    url: str
    draining: bool
    load: dict[str, float] = Field(description="The node's last published load: sources, sessions, cpu.")
    self: bool = Field(description="Whether this is the node that answered.")


class Nodes(BaseModel):
    nodes: list[NodeListing]


class Drained(BaseModel):
    node: str
    handed_over: list[str] = Field(description="The sources handed to other nodes.")
    not_taken: list[str] = Field(description="Those no other node runs yet: no node had room (they stay placed "
                                 "and the next node with room takes them), or not taken when the drain timeout "
                                 "ran out.")


async def nodes(request: web.Request) -> web.Response:
    return web.json_response({"nodes": await _node(request).nodes()})


async def drain(request: web.Request) -> web.Response:
    return web.json_response(await _node(request).drain())


CLUSTER_ROUTES: tuple[Route, ...] = (
    Route("GET", "/api/cluster/nodes", nodes, "The cluster's live nodes and their load", response=Nodes,
          errors=(401, 503), head=True),
    Route("POST", "/api/cluster/drain", drain, "Hand this node's sources over to other nodes, then stop taking "
          "new ones", response=Drained, errors=(401, 409, 503)),
)


def mount_cluster(app: web.Application, node: ClusterNode | None) -> None:
    """Make this app a cluster member (``node``: with ``cluster.redis_url``). Call before the app's own shutdown
    handler is added, so that a drain (SIGTERM) hands sources over before they are stopped."""
    if node is not None:
        app.on_startup.append(lambda app: node.start())
        app.on_shutdown.append(lambda app: node.leave())

