"""Errors in OpenAI's wire shape for the ``/v1/*`` endpoints, so the official SDKs raise their usual exceptions:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``."""

from __future__ import annotations

import json

from aiohttp import web

from server.errors import ApiError

_TYPE_FOR_STATUS = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_exceeded",
}


def _body(status: int, message: str, type: str | None, param: str | None, code: str | None) -> str:
    error_type = type or _TYPE_FOR_STATUS.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return json.dumps({"error": {"message": message, "type": error_type, "param": param, "code": code}})


class OpenAiApiError(ApiError):
    """Raise from a ``/v1/*`` handler; the JSON error middleware counts it like any ApiError."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str | None = None,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(status, code or "invalid_request", message, headers=headers)
        self.text = _body(status, message, type, param, code)


def openai_error(
    status: int, message: str, *, type: str | None = None, param: str | None = None, code: str | None = None
) -> web.Response:
    """The same body as a response to return (e.g. from a middleware that must not raise)."""
    return web.json_response(text=_body(status, message, type, param, code), status=status)
