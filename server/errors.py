"""Every HTTP error is JSON: ``{"error": {"code": ..., "message": ...}}`` with a 4xx/5xx status."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ValidationError

from server.metrics import HTTP_ERRORS

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class ApiError(web.HTTPException):
    """Raise anywhere in a handler to answer with a JSON error."""

    def __init__(self, status: int, code: str, message: str, headers: dict[str, str] | None = None) -> None:
        self.status_code = status
        super().__init__(
            text=json.dumps({"error": {"code": code, "message": message}}),
            content_type="application/json",
            headers=headers,
        )
        self.code = code


def _code_for(status: int) -> str:
    return {
        400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
        405: "method_not_allowed", 409: "conflict", 413: "body_too_large", 415: "unsupported_media_type",
        422: "invalid_body", 429: "too_many_requests", 503: "unavailable",
    }.get(status, "error" if status >= 500 else "http_error")


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
    try:
        return await handler(request)
    except ConnectionResetError as error:
        if not client_left(request, error):
            log.exception("unhandled error on %s %s", request.method, request.path)
            HTTP_ERRORS.labels(status="500", code="internal").inc()
            raise ApiError(500, "internal", "internal server error; see the server log") from None
        record_client_left(request)
        raise ApiError(400, "client_closed_request", "the client closed the connection") from None
    except ApiError as error:
        HTTP_ERRORS.labels(status=str(error.status), code=error.code).inc()
        raise
    except web.HTTPException as error:
        if error.status < 400:
            raise
        code = _code_for(error.status)
        HTTP_ERRORS.labels(status=str(error.status), code=code).inc()
        message = error.reason if error.status != 413 else "request body too large"
        raise ApiError(error.status, code, message) from None
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        HTTP_ERRORS.labels(status="500", code="internal").inc()
        raise ApiError(500, "internal", "internal server error; see the server log") from None


def json_error_reason(error: Exception) -> str:
    """Why a JSON body did not parse; RecursionError (nesting ~1,000 deep) says so instead of its long text."""
    return "nested too deeply" if isinstance(error, RecursionError) else str(error)


async def read_json_body(request: web.Request, model: type[BaseModel]) -> Any:
    """Parse and validate a JSON body, answering 400/413/415/422 with a clear message."""
    if request.content_type != "application/json":
        raise ApiError(415, "unsupported_media_type", "send the body as application/json")
    try:
        data = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise ApiError(413, "body_too_large", "request body too large") from None
    except (ValueError, RecursionError) as error:
        raise ApiError(400, "invalid_json", f"body is not valid JSON: {json_error_reason(error)}") from None
    try:
        return model.model_validate(data)
    except RecursionError:
        raise ApiError(400, "invalid_json", "body is not valid JSON: nested too deeply") from None
    except ValidationError as error:
        details = "; ".join(
            f"{'.'.join(str(p) for p in item['loc']) or '<body>'}: {item['msg']}" for item in error.errors()
        )
        raise ApiError(422, "invalid_body", details[:2000]) from None
