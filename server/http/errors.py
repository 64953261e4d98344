"""The HTTP edge of the error model (``pipelines.errors.ApiError``): one middleware renders every error as JSON,
in Vigil's shape ``{"error": {"code", "message"}}`` or, under ``/v1/``, in OpenAI's shape
``{"error": {"message", "type", "param", "code"}}`` (so the official SDKs raise their usual exceptions). The HTTP
status comes from the error's code, through the tables below; nothing else decides it.

``read_json_body`` is the one reader of JSON request bodies (``validate_json`` for a body a route has read itself).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from aiohttp import http_exceptions, web
from pydantic import BaseModel, Field, ValidationError

from pipelines.errors import ApiError, invalid_body, parse_json
from server.metrics import HTTP_ERRORS

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
M = TypeVar("M", bound=BaseModel)

OPENAI_PREFIX = "/v1/"

# code -> HTTP status. A code not listed is the client's to fix: 400. The gRPC edge maps the same codes through
# these statuses (server/grpc_api/errors.py).
HTTP_STATUS: dict[str, int] = {
    "unauthorized": 401, "invalid_api_key": 401,
    "forbidden": 403,
    "not_found": 404, "model_not_found": 404, "job_not_found": 404, "collection_not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409, "job_not_completed": 409, "job_not_active": 409, "no_other_node": 409,
    "source_on_other_node": 409, "voice_disabled": 409,
    "body_too_large": 413, "file_too_large": 413, "query_too_long": 413, "document_too_large": 413,
    "unsupported_media_type": 415,
    "request_timeout": 408,
    "range_not_satisfiable": 416,
    "invalid_body": 422,
    "too_many_requests": 429, "too_many_sessions": 429, "too_many_sources": 429, "rate_limit_exceeded": 429,
    "too_many_offers": 429, "too_many_conversations": 429, "client_not_reading": 429, "too_many_connections": 429,
    "internal": 500,
    "unavailable": 503, "server_busy": 503, "model_unavailable": 503, "rate_limiter_unavailable": 503,
    "job_store_in_use": 503, "job_store_unavailable": 503, "storage_unavailable": 503, "memory_disabled": 503,
    "cluster_unavailable": 503, "no_live_node": 503,
    "reply_timeout": 504,
}
# OpenAI answers every malformed request with 400; its SDKs expect that.
OPENAI_STATUS: dict[str, int] = {**HTTP_STATUS, "invalid_body": 400, "unsupported_media_type": 400}
OPENAI_TYPE: dict[int, str] = {
    401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_exceeded",
}
# Where OpenAI's own type differs from the one its status suggests.
OPENAI_TYPE_FOR_CODE: dict[str, str] = {"model_not_found": "invalid_request_error"}
# aiohttp's own exceptions (no route, wrong method, body over client_max_size) by status -> code
CODE_FOR_STATUS: dict[int, str] = {
    400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed",
    408: "request_timeout", 409: "conflict", 413: "body_too_large", 415: "unsupported_media_type", 422: "invalid_body",
    429: "too_many_requests", 503: "unavailable",
}
AUTH_CODES = frozenset({"unauthorized", "invalid_api_key"})
# The generic "fix your request" code: OpenAI sends ``code: null`` for these, and so do we.
GENERIC_CODE = "invalid_request"


# ---------------------------------------------------------------- the two wire shapes (also /openapi.json's schemas)


class ErrorDetail(BaseModel):
    code: str
    message: str
    details: list[dict[str, Any]] | None = Field(None, description="Per-parameter issues of an invalid body.")


class ErrorBody(BaseModel):
    """Vigil's error shape."""

    error: ErrorDetail


class OpenAiErrorDetail(BaseModel):
    message: str
    type: str = Field(description="invalid_request_error, authentication_error, permission_error, "
                      "not_found_error, rate_limit_exceeded or server_error")
    param: str | None
    code: str | None


class OpenAiErrorBody(BaseModel):
    """OpenAI's error shape, used under /v1/."""

    error: OpenAiErrorDetail


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PREFIX)


def http_status(error: ApiError, openai: bool = False) -> int:
    return (OPENAI_STATUS if openai else HTTP_STATUS).get(error.kind or error.code, 400)


def openai_error_body(error: ApiError, status: int | None = None) -> dict[str, Any]:
    status = status or http_status(error, openai=True)
    error_type = OPENAI_TYPE_FOR_CODE.get(error.code) or OPENAI_TYPE.get(status) or (
        "server_error" if status >= 500 else "invalid_request_error")
    code = None if error.code == GENERIC_CODE else error.code
    return {"error": {"message": error.message, "type": error_type, "param": error.param, "code": code}}


def vigil_error_body(error: ApiError) -> dict[str, Any]:
    body: dict[str, Any] = {"code": error.code, "message": error.message}
    if error.details:
        body["details"] = error.details
    return {"error": body}


def error_response(error: ApiError, path: str, status: int | None = None) -> web.Response:
    """``status``: only where the transport already decided it (aiohttp's protocol layer, server.http.serve)."""
    openai = is_openai_path(path)
    status = status or http_status(error, openai)
    body = openai_error_body(error, status) if openai else vigil_error_body(error)
    headers = dict(error.headers)
    if error.retry_after_s is not None:
        headers.setdefault("Retry-After", str(max(1, math.ceil(error.retry_after_s))))
    if error.code in AUTH_CODES:
        headers.setdefault("WWW-Authenticate", "Bearer")
    HTTP_ERRORS.labels(status=str(status), code=error.code).inc()
    return web.json_response(body, status=status, headers=headers)


# aiohttp's parser errors whose messages quote the raw request whatever their shape (``b'...'``, ``bytearray(b'...')``
# past 8 KiB, ``'...'`` from the pure-Python parser, or the bare line): their reason is the class's, never the text.
_PARSER_REASONS: tuple[tuple[type[BaseException], str], ...] = (
    (http_exceptions.LineTooLong, "request line or header too long"),
    (http_exceptions.BadHttpMethod, "invalid method"),
    (http_exceptions.BadStatusLine, "invalid request line"),
    (http_exceptions.InvalidURLError, "invalid request target"),
)
# aiohttp's own wording before the quoted bytes: words only ("Invalid header value char", "Invalid HTTP header")
_PLAIN_CLAUSE = re.compile(r"[A-Za-z][A-Za-z -]{2,80}")


def parser_error_reason(message: str | None, error: BaseException | None = None) -> str:
    """Why aiohttp's parser refused a request (``error``, an ``HttpProcessingError``, and its ``message``), without
    the raw bytes the message quotes: they may hold a token (in the query or a header), and they are the client's
    own input anyway. The reason is chosen by the error's class; for other errors it is the message's first clause
    when that is plain words, else "unreadable request" (a request line over 8 KiB was quoted as
    ``bytearray(b'...')`` and reached the answer and the log)."""
    for kind, reason in _PARSER_REASONS:
        if isinstance(error, kind):
            return reason
    clause = (message or "").strip().split("\n", 1)[0].split(":", 1)[0].strip(" .")
    return clause if _PLAIN_CLAUSE.fullmatch(clause) else "unreadable request"


def client_left(request: web.Request, error: BaseException) -> bool:
    """True when ``error`` only says that the client went away (mid-body or mid-response): nothing to answer,
    nothing to log as a server fault. An upstream's connection reset (also a ConnectionResetError) is not this,
    so the request's own transport must be gone too."""
    transport = request.transport
    return isinstance(error, ConnectionResetError) and (transport is None or transport.is_closing())


def record_client_left(request: web.Request) -> None:
    log.info("client left during %s %s", request.method, request.path)
    HTTP_ERRORS.labels(status="499", code="client_closed_request").inc()  # nginx's name; not a 5xx


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Outermost middleware: every error, raised anywhere below, leaves as JSON in the route family's shape."""
    try:
        return await handler(request)
    except ConnectionResetError as error:
        if not client_left(request, error):
            log.exception("unhandled error on %s %s", request.method, request.path)
            return error_response(ApiError("internal", "internal server error; see the server log"), request.path)
        record_client_left(request)  # nobody reads an answer: count it (499, not a 5xx) and close
        return web.Response(status=499)
    except ApiError as error:
        return error_response(error, request.path)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code = CODE_FOR_STATUS.get(error.status, "internal" if error.status >= 500 else "bad_request")
        message = "request body too large" if error.status == 413 else error.reason
        return error_response(ApiError(code, message), request.path)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(ApiError("internal", "internal server error; see the server log"), request.path)


async def read_json_body(request: web.Request, model: type[M], *, require_content_type: bool = True) -> M:
    """The one reader of JSON bodies: content type (415), size (413), any parse failure (400 ``invalid_json``),
    validation against ``model`` (``invalid_body``: 422, or 400 under /v1)."""
    if require_content_type and request.content_type != "application/json":
        raise ApiError("unsupported_media_type", "send the body as application/json")
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError("body_too_large", "request body too large") from None
    return validate_json(raw, model)


async def read_body(request: web.Request, limit: int, *, code: str = "body_too_large",
                    what: str = "request body") -> bytes:
    """The body, read in chunks up to a route's own ``limit`` (a 413 ``code`` beyond it, declared or not):
    ``request.read()`` applies the app-wide ``server.max_body_bytes`` (aiohttp's ``client_max_size``), which a
    route with a larger documented limit (a document) must not inherit."""
    if request.content_length is not None and request.content_length > limit:
        raise ApiError(code, f"the {what} is {request.content_length} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            raise ApiError(code, f"the {what} is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def validate_json(raw: bytes, model: type[M]) -> M:
    """A body already read, parsed by the one JSON parser and validated against ``model``: any parse failure is
    400 ``invalid_json``, a validation error ``invalid_body`` (whose message names fields, never echoes input)."""
    data = parse_json(raw)
    try:
        return model.model_validate(data)
    except RecursionError:
        raise ApiError("invalid_json", "body is not valid JSON: nested too deeply") from None
    except ValidationError as error:
        raise invalid_body(error) from None
