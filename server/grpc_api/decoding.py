"""Undecodable requests end with INVALID_ARGUMENT, not grpc.aio's UNKNOWN.

grpc.aio parses each request message with the method's deserializer before any servicer code runs, with no
context to set a status on: bytes that are not the method's protobuf message end the call with UNKNOWN
("Unexpected DecodeError"), which says "server bug" to the client. ``DecodeRequests`` (the innermost
interceptor) takes the parsing over: the method handler receives raw bytes and parses them in the call, where a
failure has a status. A unary request that does not parse aborts the call at once; in a request stream the
iterator raises ``UndecodableMessage`` (after setting INVALID_ARGUMENT on the call, so even a method that does
not catch it ends with that code), and the streaming methods catch it like their other malformed input.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

from server.grpc_api.handlers import behavior_of, with_behavior

Parse = Callable[[bytes], Any]


class UndecodableMessage(ValueError):
    """A request message in a stream is not the method's protobuf message."""


def _describe(method: str, error: Exception) -> str:
    return f"the request to {method.rsplit('/', 1)[-1]} is not a valid protobuf message of its type: {error}"


async def _parse_unary(raw: bytes, parse: Parse, method: str, context: grpc.aio.ServicerContext) -> Any:
    try:
        return parse(raw)
    except Exception as error:  # DecodeError, or anything else a parser raises on hostile bytes
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, _describe(method, error))


async def _parse_stream(raws: AsyncIterator[bytes], parse: Parse, method: str,
                        context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
    async for raw in raws:
        try:
            message = parse(raw)
        except Exception as error:
            reason = _describe(method, error)
            context.set_code(grpc.StatusCode.INVALID_ARGUMENT)
            context.set_details(reason)
            raise UndecodableMessage(reason) from None
        yield message


def _decoding(handler: grpc.RpcMethodHandler, method: str) -> Callable[..., Any]:
    behavior, parse = behavior_of(handler), handler.request_deserializer

    async def request_of(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        if handler.request_streaming:
            return _parse_stream(raw, parse, method, context)
        return await _parse_unary(raw, parse, method, context)

    if handler.response_streaming:
        async def streaming(raw: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            async with contextlib.aclosing(behavior(await request_of(raw, context), context)) as responses:
                async for response in responses:  # closed with this one (see metrics._streaming)
                    yield response
        return streaming

    async def unary(raw: Any, context: grpc.aio.ServicerContext) -> Any:
        return await behavior(await request_of(raw, context), context)
    return unary


class DecodeRequests(grpc.aio.ServerInterceptor):
    """Put it last among the interceptors: the handler it returns takes raw bytes (no request deserializer), so
    the interceptors before it (metrics, auth) wrap a handler that parses inside the call."""

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or handler.request_deserializer is None:
            return handler
        return with_behavior(handler, _decoding(handler, handler_call_details.method), request_deserializer=None)
