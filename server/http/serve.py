"""How the aiohttp app is served: one helper, ``start_serving``, used by ``vigil serve`` (``serve_forever``) and by
every in-process test server, so the tests exercise what production runs. What it adds to aiohttp's defaults:

- ``RedactingAccessLogger``: aiohttp's access log (same format) with secrets in query strings masked. Browsers
  cannot set headers on WebSockets, ``<img>`` or ``<video>``, so the dashboard sends its token as ``?token=``;
  aiohttp's default line prints the whole request target (and the Referer, which repeats the page's URL).
- ``JsonErrorRequestHandler``: what aiohttp's protocol layer answers itself, before any middleware runs
  (malformed framing such as ``Content-Length: abc``, a garbage request line; an exception past every
  middleware), leaves in Vigil's JSON error shape instead of plain text, and the parser's message, which quotes
  the raw bytes (an ``Authorization`` header included), reaches neither the client nor the log.

- Slow clients (300 connections that sent half of ``/offer``'s headers stayed open, and so did a body
  sent at 1 byte/s): ``server.header_timeout_s`` bounds how long a request's headers may take (then 408 and the
  connection closed), ``server.body_timeout_s`` how long its body may take once the headers are in, plus a second
  per ``body_min_rate_bytes_s`` bytes received (the handler
  reading it gets ``request_timeout``, answered 408, and the connection is closed after the answer, lingering
  ``LINGER_S`` to drop what the client still sends, so a reset does not lose the answer), and
  ``server.max_connections_per_address`` how many connections one client address may hold open (one more: 429
  ``too_many_connections`` and closed). aiohttp has none of these (its keep-alive timeout only closes a connection
  between requests).

aiohttp has no public switch for the request handler class: ``VigilAppRunner`` builds aiohttp's ``Server`` as
``AppRunner`` does and hands it to ``JsonErrorServer``, whose only change is the class it instantiates per
connection (tests/integration/test_hostile_input.py checks both behaviours on a live socket).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_log import AccessLogger
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from pipelines.errors import ApiError
from pipelines.sources.urls import redact_target, redact_text, redact_url
from server.config.server import ServerSettings
from server.http.errors import CODE_FOR_STATUS, HTTP_STATUS, error_response, parser_error_reason
from server.state import SETTINGS

log = logging.getLogger("aiohttp.server")  # where aiohttp's protocol layer logs, and JsonErrorRequestHandler too

LINGER_S = 2.0  # how long a connection answered with an error and closed still reads (and drops) its client's bytes


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What one client connection may take (``server.header_timeout_s``, ``body_timeout_s``,
    ``max_connections_per_address``; None: no limit)."""

    header_timeout_s: float | None = 10.0
    body_timeout_s: float | None = 30.0
    body_min_rate_bytes_s: int = 1000
    max_per_address: int | None = 128

    @classmethod
    def of(cls, server: ServerSettings) -> ConnectionLimits:
        return cls(server.header_timeout_s, server.body_timeout_s, server.body_min_rate_bytes_s,
                   server.max_connections_per_address)

    def body_allows(self, elapsed_s: float, received: int) -> float:
        """Seconds a body that took ``elapsed_s`` for its first ``received`` bytes may still take (<= 0: no more):
        ``body_timeout_s``, plus a second per ``body_min_rate_bytes_s`` bytes received."""
        if self.body_timeout_s is None:
            return float("inf")
        earned = received / self.body_min_rate_bytes_s if self.body_min_rate_bytes_s else 0.0
        return self.body_timeout_s + earned - elapsed_s


def raw_error(error: ApiError, *, retry_after_s: int | None = None) -> bytes:
    """A whole HTTP/1.1 answer in Vigil's error shape, written on a connection outside any request (there is no
    request to answer yet, or the parser never produced one), with ``Connection: close``."""
    status = HTTP_STATUS.get(error.code, 400)
    body = json.dumps({"error": {"code": error.code, "message": error.message}}).encode()
    reason = {408: "Request Timeout", 429: "Too Many Requests"}.get(status, "Error")
    head = [f"HTTP/1.1 {status} {reason}", "Content-Type: application/json; charset=utf-8",
            f"Content-Length: {len(body)}", "Connection: close"]
    if retry_after_s is not None:
        head.append(f"Retry-After: {retry_after_s}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def redact_query_secrets(text: str) -> str:
    """``text`` (a request line, a URL, a header) with every secret-bearing parameter value, and any URL password,
    masked (``pipelines.sources.urls.is_secret_key`` judges the keys). A request line and a URL are parsed into
    their parameters; anything else is free text and redacted as such."""
    method, space, rest = text.partition(" ")
    target, space2, version = rest.rpartition(" ")
    if space and space2 and version.startswith("HTTP/") and target.startswith("/"):
        return f"{method} {redact_target(target)} {version}"
    if "://" in text and not any(c.isspace() for c in text):
        return redact_url(text)
    return redact_text(text)


class RedactingAccessLogger(AccessLogger):
    """aiohttp's access logger; every logged field (the request line, headers such as the Referer) is redacted,
    in the message and in the record's structured ``extra`` alike. The request line is made again from the
    request's own target, parameter by parameter (``redact_target``), not from the text aiohttp formatted."""

    def _format_line(self, request: BaseRequest, response: web.StreamResponse,
                     time: float) -> Iterable[tuple[str | tuple[str, str], Any]]:
        fields = []
        for key, value in super()._format_line(request, response, time):
            if key == "first_request_line" and request is not None:
                version = request.version
                value = f"{request.method} {redact_target(request.raw_path)} HTTP/{version.major}.{version.minor}"
            elif isinstance(value, str):
                value = redact_query_secrets(value)
            fields.append((key, value))
        return fields


class JsonErrorRequestHandler(RequestHandler):
    """aiohttp's per-connection protocol, answering its own errors in Vigil's JSON error shape (``force_close``:
    after a framing error the stream is out of step). Never a traceback in a response.

    It also holds a slow client to ``ConnectionLimits``: one timer per connection, armed for the headers (from the
    connection, then from each request's first byte) or for the body of the request just parsed."""

    def __init__(self, manager: JsonErrorServer, *, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.limits = limits
        self.address: str | None = None
        self._deadline: asyncio.TimerHandle | None = None
        self._body: StreamReader | None = None  # the body being read under body_timeout_s
        self._body_since = 0.0  # loop time its headers were parsed
        self._partial_head = False  # bytes of a request arrived, its headers are not complete yet
        self._discarding = False  # answered with an error and closing: input is dropped (``_answer_and_close``)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        manager = self._manager
        if isinstance(manager, JsonErrorServer) and not manager.admit(self):
            cap = self.limits.max_per_address
            log.info("refused a connection from %s: %s connections from that address already", self.address, cap)
            self._answer_and_close(raw_error(ApiError(
                "too_many_connections", f"more than {cap} open connections from one address; close some and "
                "retry"), retry_after_s=1))
            return
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def connection_lost(self, exc: BaseException | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._discarding:  # answered and closing: what still arrives is read and dropped
            return
        queued = len(self._messages)
        super().data_received(data)
        if self._force_close or self._close or self._upgraded or self._payload_parser is not None:
            self._disarm()  # closing, or a WebSocket now: its own heartbeat and limits apply
            return
        parsed = list(itertools.islice(self._messages, queued, None))
        if parsed:
            self._partial_head = False
            self._disarm()
            message, payload = parsed[-1]
            if (isinstance(message, RawRequestMessage) and not message.upgrade
                    and isinstance(payload, StreamReader) and not payload.is_eof()):
                self._body, self._body_since = payload, self._loop.time()
                self._arm(self.limits.body_timeout_s, self._body_late)
        elif data and (self._body is None or self._body.is_eof()):
            self._partial_head = True  # a request's first bytes (or more of them): its headers' clock runs
            if self._deadline is None:
                self._arm(self.limits.header_timeout_s, self._headers_late)

    def _arm(self, seconds: float | None, callback: Callable[[], None]) -> None:
        self._disarm()
        if seconds is not None:
            self._deadline = self._loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if self._force_close or self._close or self.transport is None:
            return
        if self._current_request is not None and not self._partial_head:
            return  # a request is being answered; the keep-alive timeout takes over after it
        if self._current_request is not None:  # the next request, pipelined: its clock starts when this one ends
            self._arm(self.limits.header_timeout_s, self._headers_late)
            return
        seconds = self.limits.header_timeout_s
        if not self._partial_head:  # connected and sent nothing: close quietly (as an idle keep-alive connection)
            log.info("closed an idle connection from %s: no request within %s s", self.address, seconds)
            self.force_close()
            return
        log.info("closed a connection from %s: request headers not complete within %s s", self.address, seconds)
        self._answer_and_close(raw_error(ApiError(
            "request_timeout", f"the request's headers did not arrive within {seconds} s (server.header_timeout_s)")))

    def _body_late(self) -> None:
        self._deadline = None
        body, self._body = self._body, None
        if body is None or body.is_eof() or body.exception() is not None or self.transport is None:
            return
        left = self.limits.body_allows(self._loop.time() - self._body_since, body.total_bytes)
        if left > 0:  # it came at a fair rate so far: it has earned more time
            self._body = body
            self._deadline = self._loop.call_later(left, self._body_late)
            return
        seconds = self.limits.body_timeout_s
        log.info("request body from %s not complete within %s s: answered 408, closing", self.address, seconds)
        error = ApiError("request_timeout", f"the request body did not arrive within {seconds} s "
                                            "(server.body_timeout_s, body_min_rate_bytes_s)")
        request = self._current_request
        if request is not None and request.writer.output_size > 0:  # its answer has begun: nothing can replace it
            body.set_exception(error)
            self.force_close()
            return
        # Answered here, not by the handler: its read fails, and what it would answer finds the connection gone.
        self._answer_and_close(raw_error(error))
        body.set_exception(error)

    def _answer_and_close(self, answer: bytes) -> None:
        """Write ``answer`` and close the connection as nginx's ``lingering_close`` does: half-close (the answer,
        then FIN), then read and discard what the client still sends for up to ``LINGER_S`` or until it closes.
        Closing at once with its bytes unread makes the kernel reset the connection, and a client still sending
        (a slow body, half its headers) may then lose the answer before it reads it."""
        transport = self.transport
        if transport is None:
            return
        # aiohttp's side of the connection is over (as ``force_close``, but the transport stays open a while).
        self._force_close = True
        self.transport = None
        if self._waiter:
            self._waiter.cancel()
        self._discarding = True
        with contextlib.suppress(Exception):
            transport.write(answer)
            if transport.can_write_eof():
                transport.write_eof()
        self._loop.call_later(LINGER_S, transport.close)

    def handle_error(self, request: BaseRequest, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if status >= 500:
            self.log_exception("Error handling request from %s", request.remote, exc_info=exc)
            error = ApiError("internal", "internal server error; see the server log")
        else:
            # A broken or hostile client, not a server fault: one line, no traceback, no raw bytes.
            reason = parser_error_reason(message, exc)
            self.logger.info("malformed HTTP request from %s: %s (%s)", request.remote, reason,
                             type(exc).__name__ if exc else "-")
            error = ApiError(CODE_FOR_STATUS.get(status, "bad_request"), f"malformed HTTP request: {reason}")
        if request.writer.output_size > 0:  # as aiohttp's own: a response has begun, nothing can replace it
            raise ConnectionError("Response is sent already, cannot send another response with the error message")
        response = error_response(error, request.path, status=status)
        response.force_close()
        return response


class JsonErrorServer(web.Server):
    """aiohttp's low-level server, with ``JsonErrorRequestHandler`` per connection, counting open connections
    per client address (``ConnectionLimits.max_per_address``)."""

    def __init__(self, *args: Any, limits: ConnectionLimits, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limits = limits
        self.per_address: Counter[str] = Counter()

    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, limits=self.limits, **self._kwargs)

    def admit(self, handler: JsonErrorRequestHandler) -> bool:
        """Count ``handler``'s connection against its address; False when that address had its fill already."""
        transport = handler.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        address = str(peer[0]) if isinstance(peer, tuple | list) and peer else None
        if address is None:  # a Unix socket: no address to count
            return True
        handler.address = address
        self.per_address[address] += 1
        cap = self.limits.max_per_address
        return cap is None or self.per_address[address] <= cap

    def connection_lost(self, handler: RequestHandler, exc: BaseException | None = None) -> None:
        super().connection_lost(handler, exc)
        address = getattr(handler, "address", None)
        if address is not None:
            self.per_address[address] -= 1
            if self.per_address[address] <= 0:
                del self.per_address[address]


class VigilAppRunner(web.AppRunner):
    """``web.AppRunner`` serving with ``JsonErrorServer`` and ``RedactingAccessLogger``."""

    def __init__(self, app: web.Application, *, limits: ConnectionLimits | None = None, **kwargs: Any) -> None:
        kwargs.setdefault("access_log_class", RedactingAccessLogger)
        super().__init__(app, **kwargs)
        self.limits = limits or ConnectionLimits()

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # runs the app's start-up; builds aiohttp's Server with its kwargs
        return JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                               handler_cancellation=server.handler_cancellation, limits=self.limits,
                               **server._kwargs)


async def start_serving(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
                        handle_signals: bool = False) -> VigilAppRunner:
    """Start ``app`` (its start-up hooks, then a TCP listener); ``runner.cleanup()`` stops it gracefully. The
    connection limits are the app's ``server`` settings (the defaults for an app without settings)."""
    settings = app.get(SETTINGS)
    limits = ConnectionLimits.of(settings.server) if settings is not None else ConnectionLimits()
    runner = VigilAppRunner(app, shutdown_timeout=shutdown_timeout, handle_signals=handle_signals, limits=limits)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


def new_event_loop(kind: str) -> asyncio.AbstractEventLoop:
    """``server.event_loop``: ``uvloop`` (libuv) or ``asyncio`` (the standard selector loop). Every session's
    datagrams are read on this loop: asyncio's reads one datagram per readable socket per turn of the loop, libuv
    drains a socket's queue in one wake-up, which kept eight audio+video sessions alive on two cores where the
    standard loop let their ICE consent replies queue behind media until all eight dropped (bench/survival.py)."""
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def serve_forever(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
                  print: Callable[[str], None] = print, event_loop: str = "uvloop") -> None:
    """``vigil serve``: what ``web.run_app`` did (SIGINT/SIGTERM end it gracefully, waiting up to
    ``shutdown_timeout`` for requests in flight; the "Running on" line), through ``start_serving``."""

    async def serve() -> None:
        runner = await start_serving(app, host, port, shutdown_timeout=shutdown_timeout, handle_signals=True)
        try:
            names = ", ".join(sorted(str(site.name) for site in runner.sites))
            print(f"======== Running on {names} ========\n(Press CTRL+C to quit)")
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    # As web.run_app: the signal handlers raise GracefulExit out of the loop; serve() is then cancelled, so its
    # cleanup runs the app's shutdown; then the remaining tasks are cancelled and the loop closed.
    loop = new_event_loop(event_loop)
    asyncio.set_event_loop(loop)
    main = loop.create_task(serve())
    try:
        loop.run_until_complete(main)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not main.done():
                main.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(main)
        finally:
            _cancel_remaining_tasks(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()


def _cancel_remaining_tasks(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": task.exception(), "task": task})
