"""Prometheus metrics for every gRPC call: calls by method and final status code, calls in flight, duration.

A server interceptor wraps each method's handler, so calls rejected by auth, aborted with a status, cancelled by
the client or failing with a bug are all counted, by the status the client sees."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from prometheus_client import Counter, Gauge, Histogram

from server.grpc_api.handlers import HandlerInterceptor, behavior_of, with_behavior

CALLS = Counter("vigil_grpc_calls_total", "gRPC calls by method and final status code.", ["method", "code"])
IN_FLIGHT = Gauge("vigil_grpc_calls_in_flight", "gRPC calls in progress, by method.", ["method"])
DURATION = Histogram("vigil_grpc_call_seconds", "gRPC call duration (for streams: the whole stream), by method.",
                     ["method"], buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300))


class _CallRecord:
    """One call: in flight from here; around the call's work (``with``), how it ended is counted when it ends."""

    def __init__(self, method: str, context: grpc.aio.ServicerContext) -> None:
        self.method, self.context = method, context
        self.started = time.perf_counter()
        IN_FLIGHT.labels(method=method).inc()

    def __enter__(self) -> _CallRecord:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: Any) -> None:
        self.finish(error)

    def finish(self, error: BaseException | None) -> None:
        context = self.context
        if isinstance(error, asyncio.CancelledError | GeneratorExit):
            # GeneratorExit: grpc closed the response stream under the method: the call ended outside it (the
            # client cancelled, or grpc's own check refused it, e.g. a message over grpc.max_message_bytes)
            code = grpc.StatusCode.CANCELLED
        elif isinstance(error, grpc.aio.AbortError):
            code = context.code() or grpc.StatusCode.UNKNOWN  # set by context.abort
        elif error is not None:
            code = grpc.StatusCode.UNKNOWN  # what grpc answers for an unhandled exception
        else:
            code = context.code() or grpc.StatusCode.OK
        CALLS.labels(method=self.method, code=code.name).inc()
        IN_FLIGHT.labels(method=self.method).dec()
        DURATION.labels(method=self.method).observe(time.perf_counter() - self.started)


def _unary(method: str, behavior: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with _CallRecord(method, context):
            return await behavior(request, context)

    return wrapped


def _streaming(method: str, behavior: Callable[..., Any]) -> Callable[..., AsyncIterator[Any]]:
    async def wrapped(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        with _CallRecord(method, context):
            responses = behavior(request, context)
            if hasattr(responses, "__aiter__"):
                # closing this generator (grpc does, when the call ends under it) closes the method's at once,
                # so its own clean-up (a conversation's slot and voice loop) runs now, not whenever it is collected
                async with contextlib.aclosing(responses):
                    async for response in responses:
                        yield response
            else:  # a coroutine that writes with context.write (or only aborts, like the auth rejection)
                await responses

    return wrapped


class RpcMetrics(HandlerInterceptor):
    """Put it first among the interceptors, so it also sees the calls that later ones (auth) reject."""

    def wrap(self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = call.method.rsplit("/", 1)[-1]
        record = _streaming if handler.response_streaming else _unary
        return with_behavior(handler, record(method, behavior_of(handler)))
