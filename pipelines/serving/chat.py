"""The chat serving pipeline without HTTP: cache -> prompt -> LLM -> content filter, each stage timed.

``prepare`` runs the stages that decide the answer's shape before anything is sent (a cache hit, or the fitted
prompt; a prompt that cannot fit raises ``PromptTooLong``), so the HTTP layer can still answer with an error
status. ``run`` then streams ``ChatDelta``s and one final ``ChatEnd``. Closing ``run``'s iterator early (a client
that went away) closes the LLM generation, which aborts it upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from models.embeddings import TextEmbedder
from models.llm import ChatMessage, LanguageModel, LlmRequest, Usage
from pipelines.serving.cache import CachedCompletion, ExactCache, SemanticCache, stable_hash
from pipelines.serving.content_filter import StreamingContentFilter
from pipelines.serving.prompt import FittedPrompt, PromptBuilder
from pipelines.serving.telemetry import CACHE_LOOKUPS, FILTER_ACTIONS, StageTimer

log = logging.getLogger(__name__)

CacheResult = Literal["exact", "semantic", "miss", "bypass"]


@dataclass
class ChatInput:
    """A validated chat request (what the HTTP layer hands over)."""

    messages: list[ChatMessage]
    model: str
    max_tokens: int
    temperature: float = 0.0
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    documents: list[str] = field(default_factory=list)


@dataclass
class ChatPlan:
    cache: CacheResult
    cached: CachedCompletion | None = None
    similarity: float | None = None
    request: LlmRequest | None = None
    prompt: FittedPrompt | None = None
    exact_key: str | None = None
    semantic_scope: str | None = None
    semantic_vector: np.ndarray | None = None
    cacheable: bool = False


@dataclass(frozen=True)
class ChatDelta:
    text: str


@dataclass(frozen=True)
class ChatEnd:
    finish_reason: str  # stop | length | content_filter
    usage: Usage


@dataclass
class CacheConfig:
    exact: ExactCache | None = None
    semantic: SemanticCache | None = None
    embedder: TextEmbedder | None = None
    semantic_threshold: float = 0.9
    cache_sampled: bool = False


class ChatPipeline:
    def __init__(
        self,
        llm: LanguageModel,
        prompt: PromptBuilder,
        caches: CacheConfig | None = None,
        content_filter: Callable[[], StreamingContentFilter] | None = None,
    ) -> None:
        self.llm = llm
        self.prompt = prompt
        self.caches = caches or CacheConfig()
        self._new_filter = content_filter

    # ------------------------------------------------------------ before the first byte

    async def prepare(self, chat: ChatInput, timer: StageTimer) -> ChatPlan:
        with timer.stage("cache"):
            plan = await self._look_up(chat)
        CACHE_LOOKUPS.labels(result=plan.cache).inc()
        if plan.cached is not None:
            return plan
        with timer.stage("prompt"):
            fitted = await asyncio.to_thread(
                self.prompt.fit, model=chat.model, messages=chat.messages, documents=chat.documents,
                count_tokens=self.llm.count_tokens, context_window=self.llm.context_window,
                reserve_output=chat.max_tokens,
            )
        plan.prompt = fitted
        plan.request = LlmRequest(
            fitted.messages, max_tokens=chat.max_tokens, temperature=chat.temperature, model=chat.model,
            top_p=chat.top_p, stop=chat.stop, seed=chat.seed,
        )
        return plan

    def _cache_scope(self, chat: ChatInput, messages: list[ChatMessage]) -> dict[str, Any]:
        """Everything besides the messages that shapes the answer, so only like requests share entries."""
        return {
            "messages": [[m.role, m.content] for m in messages], "model": chat.model, "max_tokens": chat.max_tokens,
            "temperature": chat.temperature, "top_p": chat.top_p, "stop": chat.stop, "seed": chat.seed,
            "documents": chat.documents, "prompt": self.prompt.fingerprint,
        }

    async def _look_up(self, chat: ChatInput) -> ChatPlan:
        caches = self.caches
        cacheable = (caches.exact is not None or caches.semantic is not None) and (
            chat.temperature == 0 or caches.cache_sampled
        )
        if not cacheable:
            return ChatPlan("bypass")
        plan = ChatPlan("miss", cacheable=True)
        try:
            if caches.exact is not None:
                plan.exact_key = stable_hash(self._cache_scope(chat, chat.messages))
                hit = await caches.exact.get(plan.exact_key)
                if hit is not None:
                    plan.cache, plan.cached = "exact", hit
                    return plan
            last = chat.messages[-1]
            if caches.semantic is not None and caches.embedder is not None and last.role == "user":
                # Same preceding context (and parameters), similar last question.
                plan.semantic_scope = stable_hash(self._cache_scope(chat, chat.messages[:-1]))[:32]
                vectors = await asyncio.to_thread(caches.embedder.embed, [last.content])
                plan.semantic_vector = vectors[0]
                found = await caches.semantic.get(plan.semantic_scope, plan.semantic_vector, caches.semantic_threshold)
                if found is not None:
                    plan.cache, (plan.cached, plan.similarity) = "semantic", found
        except Exception as exc:  # a cache that is down (Redis) costs the hit, never the request
            log.warning("chat cache lookup failed, answering without it: %s", exc)
        return plan

    async def _store(self, plan: ChatPlan, completion: CachedCompletion) -> None:
        try:
            if plan.exact_key is not None and self.caches.exact is not None:
                await self.caches.exact.put(plan.exact_key, completion)
            if plan.semantic_vector is not None and plan.semantic_scope and self.caches.semantic is not None:
                await self.caches.semantic.put(plan.semantic_scope, plan.semantic_vector, completion)
        except Exception as exc:
            log.warning("chat cache store failed: %s", exc)

    # ------------------------------------------------------------ the answer

    async def run(self, plan: ChatPlan, timer: StageTimer) -> AsyncIterator[ChatDelta | ChatEnd]:
        if plan.cached is not None:
            cached = plan.cached
            yield ChatDelta(cached.text)
            yield ChatEnd(cached.finish_reason, Usage(cached.prompt_tokens, cached.completion_tokens))
            return
        assert plan.request is not None and plan.prompt is not None, "prepare() first"
        content_filter = self._new_filter() if self._new_filter is not None else None
        sent: list[str] = []
        finish_reason: str | None = None
        usage: Usage | None = None
        text_chunks = 0
        filter_ms = 0.0
        llm_start = time.perf_counter()
        try:
            async with contextlib.aclosing(self.llm.generate(plan.request)) as chunks:
                async for chunk in chunks:
                    finish_reason = finish_reason or chunk.finish_reason
                    usage = chunk.usage or usage
                    if not chunk.text:
                        continue
                    text_chunks += 1
                    if content_filter is None:
                        sent.append(chunk.text)
                        yield ChatDelta(chunk.text)
                        continue
                    filter_start = time.perf_counter()
                    result = content_filter.feed(chunk.text)
                    filter_ms += (time.perf_counter() - filter_start) * 1000
                    if result.text:
                        sent.append(result.text)
                        yield ChatDelta(result.text)
                    if result.blocked:
                        finish_reason = "content_filter"
                        break  # leaving the block closes the generation upstream
        finally:
            timer.add("llm", (time.perf_counter() - llm_start) * 1000 - filter_ms)
            if content_filter is not None:
                timer.add("filter", filter_ms)
        if content_filter is not None and finish_reason != "content_filter":
            with timer.stage("filter"):
                rest = content_filter.finish()
            if rest.text:
                sent.append(rest.text)
                yield ChatDelta(rest.text)
            if rest.blocked:
                finish_reason = "content_filter"
        if content_filter is not None:
            for kind, count in content_filter.masked.items():
                FILTER_ACTIONS.labels(action=f"masked_{kind}").inc(count)
            if content_filter.blocked:
                FILTER_ACTIONS.labels(action="blocked").inc()
        if usage is None or finish_reason == "content_filter":  # cut short: count what was generated
            usage = Usage(plan.prompt.prompt_tokens, text_chunks)
        finish_reason = finish_reason or "stop"
        if plan.cacheable and finish_reason in ("stop", "length"):
            await self._store(plan, CachedCompletion("".join(sent), finish_reason, usage.prompt_tokens,
                                                     usage.completion_tokens))
        yield ChatEnd(finish_reason, usage)
