"""Bearer-token auth: when ``auth.token`` is set, every API endpoint requires it."""

from __future__ import annotations

import hmac

from aiohttp import web

from server.errors import ApiError, Handler

# The dashboard's own files must load without a token: the page is what asks the user for it.
PUBLIC_PREFIXES = ("/static/",)
PUBLIC_PATHS = frozenset({"/", "/index.html", "/favicon.ico"})
# The OpenAI-compatible API checks API keys (or this token) in its own ingress (server/openai_api.py).
DELEGATED_PREFIXES = ("/v1/",)


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (HTTP header or gRPC metadata), or None."""
    return header[7:].strip() if header.lower().startswith("bearer ") else None


def presented_token(request: web.Request) -> str | None:
    token = bearer_token(request.headers.get("Authorization", ""))
    if token is not None:
        return token
    # Browsers cannot set headers on WebSocket upgrades; accept a query parameter too.
    return request.query.get("token")


def auth_middleware(token: str | None):
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if (token is None or request.path in PUBLIC_PATHS or request.path.startswith(PUBLIC_PREFIXES)
                or request.path.startswith(DELEGATED_PREFIXES)):
            return await handler(request)
        given = presented_token(request)
        if given is None:
            raise ApiError(401, "unauthorized", "missing token: send 'Authorization: Bearer <token>'",
                           headers={"WWW-Authenticate": "Bearer"})
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise ApiError(401, "unauthorized", "wrong token", headers={"WWW-Authenticate": "Bearer"})
        return await handler(request)

    return check
