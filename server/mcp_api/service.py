"""The Model Context Protocol server: Vigil's tools (``server.mcp_api.tools``) on the official ``mcp`` SDK,
served at ``/mcp`` by the app's own aiohttp server (streamable HTTP), behind ``auth.token`` like every ``/api``
route (the auth middleware runs before this handler).

How it is served, and why: the SDK's streamable-HTTP transport is an ASGI application (its
``StreamableHTTPSessionManager``). Running it under uvicorn would need a second port and a second server to start,
stop and secure; instead each aiohttp request is handed to the session manager as one ASGI call (a small bridge:
the scope from the request, its body as the one ``http.request`` message, the ``send`` calls written to an aiohttp
``StreamResponse``). The manager runs stateless with JSON responses: every POST is complete in itself (no session
to keep between requests, no open SSE stream to hold across a shutdown), which is all these request/response tools
need, and it keeps working with any number of server processes behind a load balancer."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Iterator
from typing import Any

from aiohttp import web
from mcp.server.mcpserver import MCPServer
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from pipelines.errors import ApiError
from server.http.route import Route
from server.mcp_api.tools import VigilTools

log = logging.getLogger(__name__)

MCP_PATH = "/mcp"


class McpService:
    """One per app (``mcp.enabled``): the SDK's server with Vigil's tools, and its session manager, which runs
    (``running``) for the app's lifetime in a task of its own (its anyio task group must be entered and left by
    one task)."""

    def __init__(self, tools: VigilTools, version: str) -> None:
        self.tools = tools
        with _root_logging_left_alone():
            self.server = self._make_server(version)
        for tool in (tools.search_memory, tools.list_events, tools.list_sources, tools.get_snapshot_url,
                     tools.list_faces, tools.ask):
            self.server.add_tool(tool, structured_output=True)
        # Built by the SDK's own app factory (its Starlette app is not used: aiohttp routes to the manager). DNS
        # rebinding protection is the SDK's guard for servers without auth on localhost; /mcp is served on
        # whatever host Vigil binds, behind the same token as /api (whose routes have no such check either).
        self.server.streamable_http_app(
            streamable_http_path=MCP_PATH, json_response=True, stateless_http=True,
            transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False))
        self.manager: StreamableHTTPSessionManager = self.server.session_manager
        self._stop = asyncio.Event()
        self._runner: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[None] | None = None

    @staticmethod
    def _make_server(version: str) -> MCPServer:
        return MCPServer(name="vigil", version=version, instructions=(
            "Vigil watches cameras and listens to microphones. Ask it what it saw and heard: search_memory, "
            "list_events (zone entries, line crossings, people by name, plates), list_sources (what each camera "
            "sees now), get_snapshot_url, list_faces, or ask a question in words."), log_level="WARNING")

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """The app's cleanup context: the session manager runs from start-up to cleanup."""
        self._ready = asyncio.get_running_loop().create_future()
        self._runner = asyncio.create_task(self._run(), name="mcp:session-manager")
        await asyncio.wait({self._ready, self._runner}, return_when=asyncio.FIRST_COMPLETED)
        if self._runner.done():
            self._runner.result()  # it failed to start: raise its error
        yield
        self._stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(self._runner, 5.0)

    async def _run(self) -> None:
        async with self.manager.run():
            assert self._ready is not None
            self._ready.set_result(None)
            await self._stop.wait()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """One streamable-HTTP request, as one ASGI call of the session manager."""
        if self._ready is None or not self._ready.done() or self._stop.is_set():
            raise ApiError("unavailable", "the MCP server is not running")
        body = await request.read()  # JSON-RPC messages: small (server.max_body_bytes applies)
        done = asyncio.Event()
        delivered = False
        response: web.StreamResponse | None = None

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await done.wait()  # the client "disconnects" only once the answer is complete
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal response
            if message["type"] == "http.response.start":
                response = web.StreamResponse(status=message["status"])
                for name, value in message.get("headers", ()):
                    response.headers.add(name.decode("latin-1"), value.decode("latin-1"))
                await response.prepare(request)
            elif message["type"] == "http.response.body" and response is not None:
                await response.write(message.get("body", b""))

        try:
            await self.manager.handle_request(_scope(request), receive, send)
        finally:
            done.set()
        if response is None:
            raise ApiError("internal", "the MCP server gave no answer")
        return response


@contextlib.contextmanager
def _root_logging_left_alone() -> Iterator[None]:
    """``MCPServer`` calls ``logging.basicConfig`` (a handler and a level on the root logger), which is the
    application's to configure: with a handler present for the moment, that call does nothing."""
    root = logging.getLogger()
    placeholder = logging.NullHandler()
    root.addHandler(placeholder)
    try:
        yield
    finally:
        root.removeHandler(placeholder)


def _scope(request: web.Request) -> dict[str, Any]:
    host, port = (request.transport.get_extra_info("sockname") or ("127.0.0.1", 0))[:2] if request.transport \
        else ("127.0.0.1", 0)
    peer = request.transport.get_extra_info("peername") if request.transport else None
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": request.scheme, "path": request.path,
        "raw_path": request.raw_path.split("?", 1)[0].encode("latin-1"),
        "query_string": request.query_string.encode("latin-1"), "root_path": "",
        "headers": [(name.lower(), value) for name, value in request.raw_headers],
        "client": tuple(peer[:2]) if peer else None, "server": (host, port), "state": {},
    }


async def mcp_request(request: web.Request) -> web.StreamResponse:
    return await request.app[MCP_SERVICE].handle(request)


async def no_stream(request: web.Request) -> web.StreamResponse:
    # Stateless: the server never sends unprompted, so it offers no SSE stream (the transport would hold the GET
    # open forever); the protocol's answer for that is 405.
    raise ApiError("method_not_allowed", "this MCP server offers no server-initiated stream: POST requests to /mcp")


MCP_SERVICE: web.AppKey[McpService] = web.AppKey("mcp_service")

MCP_ROUTES: tuple[Route, ...] = (
    Route("POST", MCP_PATH, mcp_request, "Model Context Protocol (streamable HTTP, stateless, JSON answers): "
          "JSON-RPC requests; tools search_memory, list_events, list_sources, get_snapshot_url, list_faces, ask",
          errors=(400, 401, 406, 415)),
    Route("GET", MCP_PATH, no_stream, "Model Context Protocol: no server-initiated stream (stateless)",
          errors=(401, 405)),
    Route("DELETE", MCP_PATH, mcp_request, "Model Context Protocol: no session to end (stateless: 405)",
          errors=(401, 405)),
)


def mcp_routes(enabled: bool) -> tuple[Route, ...]:
    return MCP_ROUTES if enabled else ()


def mount_mcp(app: web.Application, service: McpService | None) -> None:
    if service is not None:
        app.cleanup_ctx.append(service.running)
