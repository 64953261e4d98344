"""Interceptor plumbing: rebuild a method handler around a new behaviour, keeping its kind and serializers; the
base of Vigil's interceptors, which each rebuild the handler of every method the server has."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

_KEEP: Any = object()

_MAKERS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def behavior_of(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    return handler.unary_unary or handler.unary_stream or handler.stream_unary or handler.stream_stream


def with_behavior(handler: grpc.RpcMethodHandler, behavior: Callable[..., Any],
                  request_deserializer: Callable[[bytes], Any] | None = _KEEP) -> grpc.RpcMethodHandler:
    """A handler of the same kind (request/response streaming) and serializers as ``handler`` running
    ``behavior``; ``request_deserializer`` replaces the handler's (None: the behaviour gets raw bytes)."""
    make = _MAKERS[(handler.request_streaming, handler.response_streaming)]
    if request_deserializer is _KEEP:
        request_deserializer = handler.request_deserializer
    return make(behavior, request_deserializer=request_deserializer,
                response_serializer=handler.response_serializer)


class HandlerInterceptor(grpc.aio.ServerInterceptor):
    """An interceptor that rebuilds the handler of each method the server has (``wrap``); an unknown method's
    ``None`` passes through (grpc answers UNIMPLEMENTED)."""

    def wrap(self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        raise NotImplementedError

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        return handler if handler is None else self.wrap(handler, handler_call_details)
