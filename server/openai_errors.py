"""Errors in OpenAI's wire shape, for the OpenAI-compatible ``/v1/...`` endpoints: the official SDKs read
``{"error": {"message", "type", "param", "code"}}`` and raise their typed exceptions from the status."""

from __future__ import annotations

from aiohttp import web


def openai_error(
    status: int,
    message: str,
    *,
    type: str = "invalid_request_error",  # shadows the builtin on purpose: it is OpenAI's field name
    param: str | None = None,
    code: str | None = None,
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": type, "param": param, "code": code}}, status=status
    )
