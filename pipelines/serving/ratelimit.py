"""Sliding-window rate limits (a log of request times per key): in-process, or in Redis so that several Vigil
processes share one limit.

A request is admitted when fewer than ``limit`` admitted requests fall inside the last ``window_s`` seconds;
a refused request is not recorded (so hammering does not extend the wait) and learns how long until the oldest
admitted one leaves the window (``retry_after_s``, for the HTTP ``Retry-After`` header).
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class RateDecision:
    allowed: bool
    remaining: int
    retry_after_s: float  # 0 when allowed


class RateLimiter(Protocol):
    async def hit(self, key: str, limit: int, window_s: float) -> RateDecision: ...

    async def close(self) -> None: ...


class InProcessRateLimiter:
    """Per-process limits; at most ``max_keys`` keys are tracked (least recently used dropped first)."""

    def __init__(self, max_keys: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self._windows: OrderedDict[str, deque[float]] = OrderedDict()
        self._max_keys = max_keys
        self._clock = clock

    async def hit(self, key: str, limit: int, window_s: float) -> RateDecision:
        now = self._clock()
        window = self._windows.pop(key, None) or deque()
        self._windows[key] = window  # most recently used last
        while window and window[0] <= now - window_s:
            window.popleft()
        if len(window) >= limit:
            return RateDecision(False, 0, max(window[0] + window_s - now, 0.001))
        window.append(now)
        while len(self._windows) > self._max_keys:
            self._windows.popitem(last=False)
        return RateDecision(True, limit - len(window), 0.0)

    async def close(self) -> None:
        self._windows.clear()


# One atomic step on a sorted set of request times (scores in ms from the Redis clock, so processes on
# different machines agree): drop what left the window, admit if there is room, else say when there will be.
_SLIDING_WINDOW_LUA = """
local key = KEYS[1]
local limit = tonumber(ARGV[1])
local window_ms = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window_ms)
local count = redis.call('ZCARD', key)
if count < limit then
  redis.call('ZADD', key, now, ARGV[3])
  redis.call('PEXPIRE', key, window_ms)
  return {1, limit - count - 1, 0}
end
local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
return {0, 0, tonumber(oldest[2]) + window_ms - now}
"""


class RedisRateLimiter:
    """Limits shared through Redis (a sorted set per key, updated by one Lua script)."""

    def __init__(self, client: Any, key_prefix: str = "vigil:") -> None:
        self._redis = client  # redis.asyncio.Redis
        self._prefix = key_prefix + "ratelimit:"
        self._script = client.register_script(_SLIDING_WINDOW_LUA)

    async def hit(self, key: str, limit: int, window_s: float) -> RateDecision:
        window_ms = max(1, round(window_s * 1000))
        # The member must be unique: two requests in the same millisecond are two entries.
        allowed, remaining, retry_ms = await self._script(
            keys=[self._prefix + key], args=[limit, window_ms, uuid.uuid4().hex]
        )
        return RateDecision(bool(allowed), int(remaining), max(int(retry_ms), 1) / 1000 if not allowed else 0.0)

    async def close(self) -> None:
        """The Redis client belongs to whoever made it."""
