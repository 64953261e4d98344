"""Cancelling a request's work when its HTTP client goes away."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class ClientDisconnected(Exception):
    pass


class DisconnectWatcher:
    """Cancels a request's work when its client goes away.

    aiohttp does not cancel handlers when the client leaves (handler_cancellation is off) and offers no event for
    it, so transports are polled; but by one timer for every request in flight, not one per request: on a small
    machine each wake-up of this thread can stall llama.cpp's decoding threads, and per-request pollers made those
    wake-ups grow with concurrency (the pipeline overhead at concurrency 8). The timer stops while nothing is
    watched."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._watched: dict[asyncio.Future[Any], web.Request] = {}
        self._left: set[asyncio.Future[Any]] = set()  # work cancelled because its client went away
        self._poller: asyncio.Task[None] | None = None

    async def run(self, request: web.Request, work: Awaitable[T]) -> T:
        """Await ``work``; cancel it (and so the generation) and raise ClientDisconnected if the client leaves."""
        task = asyncio.ensure_future(work)
        self._watched[task] = request
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="chat-api:disconnects")
        try:
            return await task  # cancelling this await (server shutdown) cancels the work too
        except asyncio.CancelledError:
            if task in self._left:
                raise ClientDisconnected() from None
            raise
        finally:
            self._watched.pop(task, None)
            self._left.discard(task)

    async def _poll(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval_s)
            for task, request in list(self._watched.items()):
                if not task.done() and _client_gone(request):
                    self._left.add(task)
                    task.cancel()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)


DISCONNECTS = web.AppKey("chat_disconnects", DisconnectWatcher)
