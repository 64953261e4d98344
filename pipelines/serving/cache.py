"""Response caches of the chat API: exact match (a hash over everything that shapes the answer) and semantic
(a paraphrase of the last question, under the same preceding context, by cosine similarity of embeddings).

Both come in-process (bounded, oldest evicted first, TTL) and in Redis (shared by several processes). The
semantic Redis store keeps at most ``max_entries`` vectors per context scope and scans them linearly: no
vector index (RediSearch) is needed at this size.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np


@dataclass(frozen=True)
class CachedCompletion:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False)

    @classmethod
    def from_json(cls, data: str | bytes) -> CachedCompletion:
        return cls(**json.loads(data))


def stable_hash(payload: Any) -> str:
    """SHA-256 of canonical JSON: equal payloads give equal keys in every process."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


class ExactCache(Protocol):
    async def get(self, key: str) -> CachedCompletion | None: ...

    async def put(self, key: str, value: CachedCompletion) -> None: ...


class SemanticCache(Protocol):
    async def get(self, scope: str, vector: np.ndarray, threshold: float) -> tuple[CachedCompletion, float] | None:
        """The most similar entry of ``scope`` at or above ``threshold`` (with its similarity), if any."""
        ...

    async def put(self, scope: str, vector: np.ndarray, value: CachedCompletion) -> None: ...


class InProcessExactCache:
    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._entries: OrderedDict[str, tuple[float, CachedCompletion]] = OrderedDict()
        self._ttl_s, self._max_entries, self._clock = ttl_s, max_entries, clock

    async def get(self, key: str) -> CachedCompletion | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            del self._entries[key]
            return None
        return entry[1]

    async def put(self, key: str, value: CachedCompletion) -> None:
        self._entries.pop(key, None)
        self._entries[key] = (self._clock() + self._ttl_s, value)
        while len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


class RedisExactCache:
    def __init__(self, client: Any, ttl_s: float, key_prefix: str = "vigil:") -> None:
        self._redis, self._ttl_ms, self._prefix = client, max(1, round(ttl_s * 1000)), key_prefix + "cache:exact:"

    async def get(self, key: str) -> CachedCompletion | None:
        data = await self._redis.get(self._prefix + key)
        return CachedCompletion.from_json(data) if data is not None else None

    async def put(self, key: str, value: CachedCompletion) -> None:
        await self._redis.set(self._prefix + key, value.to_json(), px=self._ttl_ms)


class InProcessSemanticCache:
    """One preallocated matrix of unit vectors used as a ring buffer; a lookup is one matrix-vector product."""

    def __init__(self, ttl_s: float, max_entries: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._ttl_s, self._max_entries, self._clock = ttl_s, max_entries, clock
        self._vectors: np.ndarray | None = None  # (max_entries, dimension), allocated on the first put
        self._meta: list[tuple[str, float, CachedCompletion] | None] = [None] * max_entries
        self._next = 0

    async def get(self, scope: str, vector: np.ndarray, threshold: float) -> tuple[CachedCompletion, float] | None:
        if self._vectors is None:
            return None
        now = self._clock()
        live = np.array([m is not None and m[0] == scope and m[1] > now for m in self._meta])
        if not live.any():
            return None
        similarities = np.where(live, self._vectors @ vector.astype(np.float32), -np.inf)
        best = int(np.argmax(similarities))
        meta = self._meta[best]
        if meta is None or similarities[best] < threshold:
            return None
        return meta[2], float(similarities[best])

    async def put(self, scope: str, vector: np.ndarray, value: CachedCompletion) -> None:
        if self._vectors is None:
            self._vectors = np.zeros((self._max_entries, vector.shape[0]), dtype=np.float32)
        self._vectors[self._next] = vector
        self._meta[self._next] = (scope, self._clock() + self._ttl_s, value)
        self._next = (self._next + 1) % self._max_entries


class RedisSemanticCache:
    """A Redis list per scope of {vector, expiry, answer}, newest first, trimmed to ``max_entries``."""

    def __init__(self, client: Any, ttl_s: float, max_entries: int, key_prefix: str = "vigil:") -> None:
        self._redis, self._ttl_s, self._max_entries = client, ttl_s, max_entries
        self._prefix = key_prefix + "cache:semantic:"

    async def get(self, scope: str, vector: np.ndarray, threshold: float) -> tuple[CachedCompletion, float] | None:
        raw_entries = await self._redis.lrange(self._prefix + scope, 0, self._max_entries - 1)
        if len(raw_entries) > 16:  # decoding and scoring many entries takes milliseconds: not on the event loop
            return await asyncio.to_thread(self._best, raw_entries, vector, threshold)
        return self._best(raw_entries, vector, threshold)

    @staticmethod
    def _best(raw_entries: list[bytes], vector: np.ndarray, threshold: float) -> tuple[CachedCompletion, float] | None:
        now = time.time()  # wall clock: the entries may come from another process
        best: tuple[CachedCompletion, float] | None = None
        query = vector.astype(np.float32)
        for raw in raw_entries:
            entry = json.loads(raw)
            if entry["expires"] <= now:
                continue
            similarity = float(np.frombuffer(base64.b64decode(entry["vector"]), dtype=np.float32) @ query)
            if similarity >= threshold and (best is None or similarity > best[1]):
                best = (CachedCompletion(**entry["answer"]), similarity)
        return best

    async def put(self, scope: str, vector: np.ndarray, value: CachedCompletion) -> None:
        entry = json.dumps({
            "vector": base64.b64encode(vector.astype(np.float32).tobytes()).decode(),
            "expires": time.time() + self._ttl_s,
            "answer": asdict(value),
        }, ensure_ascii=False)
        key = self._prefix + scope
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.lpush(key, entry)
            pipe.ltrim(key, 0, self._max_entries - 1)
            pipe.pexpire(key, max(1, round(self._ttl_s * 1000)))
            await pipe.execute()
