"""The app's one Redis client (when ``redis.url`` is set): the /v1 rate limiter and the chat caches share it."""

from __future__ import annotations

from typing import Any

from server.config import Settings


def open_redis(settings: Settings) -> Any:
    """The client, or None without ``redis.url`` (connections are made lazily, on first use; the app closes it)."""
    if settings.redis.url is None:
        return None
    import redis.asyncio as aioredis  # deferred: only deployments that share state load it

    return aioredis.from_url(settings.redis.url.get_secret_value())
