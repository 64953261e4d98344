"""How the aiohttp app is served: one helper, ``start_serving``, used by ``vigil serve`` (``serve_forever``) and by
every in-process test server, so the tests exercise what production runs. What it adds to aiohttp's defaults:

- ``RedactingAccessLogger``: aiohttp's access log (same format) with secrets in query strings masked. Browsers
  cannot set headers on WebSockets, ``<img>`` or ``<video>``, so the dashboard sends its token as ``?token=``;
  aiohttp's default line prints the whole request target (and the Referer, which repeats the page's URL).
- ``JsonErrorRequestHandler``: what aiohttp's protocol layer answers itself, before any middleware runs
  (malformed framing such as ``Content-Length: abc``, a garbage request line; an exception past every
  middleware), leaves in Vigil's JSON error shape instead of plain text, and the parser's message, which quotes
  the raw bytes (an ``Authorization`` header included), reaches neither the client nor the log.

aiohttp has no public switch for the request handler class: ``VigilAppRunner`` builds aiohttp's ``Server`` as
``AppRunner`` does and hands it to ``JsonErrorServer``, whose only change is the class it instantiates per
connection (tests/integration/test_hostile_input.py checks both behaviours on a live socket).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

from aiohttp import web
from aiohttp.web_log import AccessLogger
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from pipelines.errors import ApiError
from pipelines.sources.urls import redact_target, redact_text, redact_url
from server.http.errors import CODE_FOR_STATUS, error_response, parser_error_reason


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
    after a framing error the stream is out of step). Never a traceback in a response."""

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
    """aiohttp's low-level server, with ``JsonErrorRequestHandler`` per connection."""

    def __call__(self) -> RequestHandler:
        return JsonErrorRequestHandler(self, loop=self._loop, **self._kwargs)


class VigilAppRunner(web.AppRunner):
    """``web.AppRunner`` serving with ``JsonErrorServer`` and ``RedactingAccessLogger``."""

    def __init__(self, app: web.Application, **kwargs: Any) -> None:
        kwargs.setdefault("access_log_class", RedactingAccessLogger)
        super().__init__(app, **kwargs)

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()  # runs the app's start-up; builds aiohttp's Server with its kwargs
        return JsonErrorServer(server.request_handler, request_factory=server.request_factory,
                               handler_cancellation=server.handler_cancellation, **server._kwargs)


async def start_serving(app: web.Application, host: str, port: int, *, shutdown_timeout: float,
                        handle_signals: bool = False) -> VigilAppRunner:
    """Start ``app`` (its start-up hooks, then a TCP listener); ``runner.cleanup()`` stops it gracefully."""
    runner = VigilAppRunner(app, shutdown_timeout=shutdown_timeout, handle_signals=handle_signals)
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
