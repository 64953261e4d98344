"""The app's one Redis client (when ``redis.url`` is set): the /v1 rate limiter and the chat caches share it."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from server.config import Settings

REDIS = web.AppKey("redis", object)


def setup_redis(app: web.Application, settings: Settings) -> Any:
    """Open the client (connections are made lazily, on first use) and close it on the app's cleanup."""
    if settings.redis.url is None:
        return None
    import redis.asyncio as aioredis  # deferred: only deployments that share state load it

    client = aioredis.from_url(settings.redis.url.get_secret_value())
    app[REDIS] = client

    async def close(app: web.Application) -> None:
        await client.aclose()

    app.on_cleanup.append(close)
    return client
