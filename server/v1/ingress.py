"""The ingress of every ``/v1/`` route (chat, models, audio): who is calling (an API key, the server's bearer
token, or the client's address on an open server), whether they are within their rate limit, and whether the
declared request size fits the route. Installed by the app once, for every ``/v1/`` route present or added
later; the handlers behind it (``server.v1.chat``, ``server.v1.audio``) own no auth of their own.

Errors are ``ApiError``s; the app's error middleware renders them in OpenAI's shape.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from pipelines.errors import ApiError
from pipelines.serving.ratelimit import InProcessRateLimiter, RateLimiter, RedisRateLimiter
from pipelines.serving.telemetry import RATE_LIMITED, StageTimer
from server.config import RateLimit, Settings
from server.http.auth import presented_token
from server.http.errors import OPENAI_PREFIX, Handler

log = logging.getLogger(__name__)

STAGE_TIMER = web.RequestKey("vigil_stage_timer", StageTimer)
API_IDENTITY = web.RequestKey("vigil_api_identity", str)  # "key:<name>", "token" or "ip:<address>"
MULTIPART_FIELD_BYTES = 64 * 1024  # an upload's form fields other than the file (model, prompt, ...) together


@dataclass
class ApiKeyEntry:
    name: str
    secret: bytes
    rate_limit: RateLimit | None


def body_limits(settings: Settings) -> list[tuple[str, int]]:
    """(path prefix, largest declared body) for the /v1 routes, most specific first; others:
    ``server.max_body_bytes``. Uploads are streamed and checked again as they arrive (chunked bodies declare
    no size)."""
    transcription = settings.transcription
    return [
        ("/v1/audio/transcriptions/jobs", transcription.max_job_upload_bytes + MULTIPART_FIELD_BYTES),
        ("/v1/audio/transcriptions", transcription.max_upload_bytes + MULTIPART_FIELD_BYTES),
    ]


class V1Ingress:
    """API keys (or the bearer token), the per-caller sliding-window rate limit and declared body sizes."""

    def __init__(self, settings: Settings, redis: Any = None) -> None:
        self.settings = settings
        api = settings.api
        self.keys = [ApiKeyEntry(k.name, k.key.get_secret_value().encode(), k.rate_limit) for k in api.keys]
        self.fallback_token = settings.auth.token.get_secret_value().encode() if settings.auth.token else None
        self.limiter: RateLimiter = (
            RedisRateLimiter(redis, settings.redis.key_prefix) if redis is not None else InProcessRateLimiter()
        )
        self.body_limits = body_limits(settings)

    def identify(self, request: web.Request) -> tuple[str, RateLimit | None]:
        """(rate-limit identity, limit) of the caller, or an ``invalid_api_key`` error."""
        default_limit = self.settings.api.rate_limit
        given = presented_token(request)
        if self.keys or self.fallback_token is not None:
            if not given:
                raise ApiError("invalid_api_key", "missing API key: send 'Authorization: Bearer <key>'")
            presented = given.encode()
            matched: ApiKeyEntry | None = None
            for key in self.keys:  # compare with every key, so timing does not tell which one nearly matched
                if hmac.compare_digest(presented, key.secret):
                    matched = key
            if matched is not None:
                return f"key:{matched.name}", matched.rate_limit or default_limit
            if not self.keys and self.fallback_token is not None and hmac.compare_digest(
                presented, self.fallback_token
            ):
                return "token", default_limit
            raise ApiError("invalid_api_key", "incorrect API key")
        return f"ip:{request.remote}", default_limit  # open server: limit per client address

    async def check_rate(self, identity: str, limit: RateLimit) -> None:
        try:
            decision = await self.limiter.hit(identity, limit.requests, limit.window_s)
        except Exception as exc:  # Redis down: refuse rather than run unlimited
            log.warning("rate limiter unavailable: %s", exc)
            raise ApiError("rate_limiter_unavailable", "rate limiter unavailable, try again shortly",
                           retry_after_s=1) from exc
        if not decision.allowed:
            RATE_LIMITED.labels(key=identity.partition(":")[2] if identity.startswith("key:")
                                else identity.partition(":")[0]).inc()
            raise ApiError(
                "rate_limit_exceeded", f"rate limit reached: {limit.requests} requests per {limit.window_s:g} s; "
                f"retry in {decision.retry_after_s:.1f} s", retry_after_s=decision.retry_after_s,
                headers={"X-RateLimit-Limit-Requests": str(limit.requests), "X-RateLimit-Remaining-Requests": "0"},
            )

    def check_size(self, request: web.Request) -> None:
        declared = request.content_length
        if declared is None:
            return
        limit = next((size for prefix, size in self.body_limits if request.path.startswith(prefix)),
                     self.settings.server.max_body_bytes)
        if declared > limit:
            is_upload = request.content_type.startswith("multipart/")
            raise ApiError("file_too_large" if is_upload else "body_too_large",
                           f"the {'upload' if is_upload else 'request body'} is larger than the limit of {limit} "
                           "bytes", param="file" if is_upload else None)

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def ingress(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith(OPENAI_PREFIX):
                return await handler(request)
            timer = StageTimer()
            request[STAGE_TIMER] = timer
            with timer.stage("ingress"):
                identity, limit = self.identify(request)
                request[API_IDENTITY] = identity
                if limit is not None:
                    await self.check_rate(identity, limit)
                self.check_size(request)
            return await handler(request)

        return ingress

    async def close(self) -> None:
        await self.limiter.close()


def mount_v1_ingress(app: web.Application, ingress: V1Ingress) -> None:
    app.middlewares.append(ingress.middleware())

    async def close(app: web.Application) -> None:
        await ingress.close()

    app.on_cleanup.append(close)


V1_INGRESS = web.AppKey("v1_ingress", V1Ingress)
