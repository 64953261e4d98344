"""Undecodable requests end with INVALID_ARGUMENT (code ``invalid_message``), not grpc.aio's UNKNOWN.

grpc.aio parses each request message with the method's deserializer before any servicer code runs, with no
context to set a status on: bytes that are not the method's protobuf message end the call with UNKNOWN
("Unexpected DecodeError"), which says "server bug" to the client. ``DecodeRequests`` (the innermost
interceptor) takes the parsing over: the method handler receives raw bytes and parses them in the call, where a
failure has a status. A message that does not parse raises ``UndecodableMessage``, an ``ApiError``: at once for a
unary request, from the iterator in a request stream; ``server.grpc_api.errors.ApiErrors`` ends the call with it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from pipelines.errors import ApiError
from server.grpc_api.handlers import HandlerInterceptor, behavior_of, with_behavior

Parse = Callable[[bytes], Any]


class UndecodableMessage(ApiError):
    """A request message is not the method's protobuf message."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_message", message)


def _describe(method: str, error: Exception) -> str:
    return f"the request to {method.rsplit('/', 1)[-1]} is not a valid protobuf message of its type: {error}"


def _parse(raw: bytes, parse: Parse, method: str) -> Any:
    try:
        return parse(raw)
    except Exception as error:  # DecodeError, or anything else a parser raises on hostile bytes
        raise UndecodableMessage(_describe(method, error)) from None


async def _parse_stream(raws: AsyncIterator[bytes], parse: Parse, method: str) -> AsyncIterator[Any]:
    async for raw in raws:
        yield _parse(raw, parse, method)


def _decoding(handler: grpc.RpcMethodHandler, method: str) -> Callable[..., Any]:
    behavior, parse = behavior_of(handler), handler.request_deserializer

    def request_of(raw: Any) -> Any:
        if handler.request_streaming:
            return _parse_stream(raw, parse, method)
        return _parse(raw, parse, method)

    if handler.response_streaming:
        async def streaming(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with contextlib.aclosing(behavior(request_of(raw), context)) as responses:
                async for response in responses:  # closed with this one (see metrics._streaming)
                    yield response
        return streaming

    async def unary(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(request_of(raw), context)
    return unary


class DecodeRequests(HandlerInterceptor):
    """Put it last among the interceptors: the handler it returns takes raw bytes (no request deserializer), so
    the interceptors before it (metrics, auth) wrap a handler that parses inside the call."""

    def wrap(self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        if handler.request_deserializer is None:
            return handler
        return with_behavior(handler, _decoding(handler, call.method), request_deserializer=None)
