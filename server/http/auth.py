"""Bearer-token auth: when ``auth.token`` is set, every API endpoint requires it."""

from __future__ import annotations

import hmac

from aiohttp import web

from pipelines.errors import ApiError
from server.http.errors import Handler

# The dashboard's own files must load without a token: the page is what asks the user for it.
PUBLIC_PREFIXES = ("/static/",)
# Probes too: an orchestrator holds no secret (server/http/probes.py); they reveal nothing without the token.
PUBLIC_PATHS = frozenset({"/", "/index.html", "/favicon.ico", "/healthz", "/livez", "/readyz"})
# The /v1 routes check API keys (or this token) in their own ingress (server/v1/ingress.py).
DELEGATED_PREFIXES = ("/v1/",)


def bearer_token(header: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` value (HTTP header or gRPC metadata), or None. The
    scheme is matched case-insensitively (RFC 9110 11.1) and any whitespace may follow it: the one parser for
    /api, /v1 and gRPC alike."""
    parts = header.split(None, 1)
    return parts[1].strip() if len(parts) == 2 and parts[0].lower() == "bearer" else None


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
            raise ApiError("unauthorized", "missing token: send 'Authorization: Bearer <token>'")
        if not hmac.compare_digest(given.encode(), token.encode()):
            raise ApiError("unauthorized", "wrong token")
        return await handler(request)

    return check
