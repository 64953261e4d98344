"""The gRPC edge of the error model (``pipelines.errors.ApiError``): every method, the auth rejection and request
parsing raise ``ApiError``; one interceptor (``ApiErrors``) ends the call with the status the error's code stands
for and its message. The status comes from the code through the HTTP edge's table (``server.http.errors.HTTP_STATUS``)
and the HTTP-to-gRPC table below: a new code that is not a 400 is one line in ``HTTP_STATUS``, for both edges.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from pipelines.errors import ApiError
from server.grpc_api.handlers import HandlerInterceptor, behavior_of, with_behavior
from server.http.errors import http_status

GRPC_STATUS_FOR_HTTP = {
    400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED, 500: grpc.StatusCode.INTERNAL, 503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


# Where the edges differ on purpose: a recording too long for the synchronous transcription endpoint is the
# client's 400 there (submit it as a job), while a gRPC stream past grpc.max_audio_s exhausted its allowance.
GRPC_STATUS_FOR_CODE = {"audio_too_long": grpc.StatusCode.RESOURCE_EXHAUSTED}


def grpc_status(error: ApiError) -> grpc.StatusCode:
    """The code's status, through the HTTP edge's table (the few deliberate differences above aside)."""
    if error.code in GRPC_STATUS_FOR_CODE:
        return GRPC_STATUS_FOR_CODE[error.code]
    return GRPC_STATUS_FOR_HTTP.get(http_status(error), grpc.StatusCode.INVALID_ARGUMENT)


async def _abort(context: grpc.aio.ServicerContext, error: ApiError) -> None:
    await context.abort(grpc_status(error), error.message)


def _ending_errors(handler: grpc.RpcMethodHandler) -> Callable[..., Any]:
    behavior = behavior_of(handler)
    if handler.response_streaming:
        async def streaming(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            try:
                responses = behavior(request, context)
                if hasattr(responses, "__aiter__"):
                    async with contextlib.aclosing(responses):  # closed with this one (see metrics._streaming)
                        async for response in responses:
                            yield response
                else:  # a coroutine (the auth rejection)
                    await responses
            except ApiError as error:
                await _abort(context, error)
        return streaming

    async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await behavior(request, context)
        except ApiError as error:
            await _abort(context, error)
    return unary


class ApiErrors(HandlerInterceptor):
    """Ends a call that raised ``ApiError`` with its status. Put it outside the auth interceptor (so the rejection
    it returns is covered) and inside the metrics one (which then counts the status the client sees)."""

    def wrap(self, handler: grpc.RpcMethodHandler, call: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        return with_behavior(handler, _ending_errors(handler))
