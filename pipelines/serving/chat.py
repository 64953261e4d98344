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
from collections import deque
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from models.embeddings import TextEmbedder
from models.llm import ChatMessage, LanguageModel, LlmRequest, TokenChunk, Usage
from pipelines.serving.cache import CachedCompletion, ExactCache, SemanticCache, stable_hash
from pipelines.serving.content_filter import StreamingContentFilter
from pipelines.serving.prompt import FittedPrompt, PromptBuilder, PromptTooLong
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
    logprobs: bool = False  # report each sent token's log-probability (such requests bypass the caches)
    conversation_id: str | None = None  # keeps a conversation on the upstream holding its KV cache (routing)


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
    # A generation started before the semantic lookup finished (see ``prepare``); ``run`` takes it over.
    _generation: AsyncIterator[TokenChunk] | None = None
    _first_chunk: asyncio.Task[TokenChunk] | None = None
    _llm_started: float | None = None

    def start_generation(self, llm: LanguageModel) -> None:
        assert self.request is not None
        self._llm_started = time.perf_counter()
        self._generation = llm.generate(self.request)
        self._first_chunk = asyncio.ensure_future(anext(self._generation))

    async def discard_generation(self) -> None:
        """Stop a generation that ``run`` never took over (a semantic hit, an error, a client that left)."""
        first, generation = self._first_chunk, self._generation
        self._first_chunk = self._generation = None
        if first is not None:
            first.cancel()  # cancelling the pending step closes the generator (and so the upstream request)
            with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration, Exception):
                await first
        if generation is not None:
            with contextlib.suppress(Exception):
                await generation.aclose()


@dataclass(frozen=True)
class TokenLogprob:
    token: str
    logprob: float | None  # None: the backend did not report it


@dataclass(frozen=True)
class ChatDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] | None = None  # when asked for: the tokens this delta completes


class LogprobTracker:
    """Pairs the text sent with the log-probabilities of the tokens it came from, when the content filter sits
    between them: it holds text back (possibly mid-token) and masks some.

    Text is passed on in whole tokens: what the filter releases waits here until the tokens it belongs to are
    complete. Tokens whose own text was sent unchanged get one entry each; where the filter changed the text
    (a mask), the tokens behind it become one entry carrying the text sent (the mask, never the masked PII) and
    their summed log-probability."""

    def __init__(self) -> None:
        self._pending: deque[tuple[int, str, float | None]] = deque()  # (end offset in the raw text, text, logprob)
        self._fed = 0  # raw characters generated
        self._complete: list[tuple[str, float | None]] = []  # tokens fully released, not yet passed on
        self._released = ""  # released text not yet passed on

    def add(self, text: str, logprob: float | None) -> None:
        self._fed += len(text)
        self._pending.append((self._fed, text, logprob))

    def release(self, released: str, held_chars: int) -> tuple[str, tuple[TokenLogprob, ...]]:
        """Take what the filter released (``held_chars`` are still held); return the text to send now and the
        entries of the tokens it completes."""
        self._released += released
        released_upto = self._fed - held_chars
        while self._pending and self._pending[0][0] <= released_upto:
            _, text, logprob = self._pending.popleft()
            self._complete.append((text, logprob))
        partial = ""  # the released start of a token whose rest is still held
        if self._pending:
            end, text, _ = self._pending[0]
            partial = text[: max(0, released_upto - (end - len(text)))]
        if not self._complete or not self._released.endswith(partial):
            return "", ()  # nothing complete yet, or a mask reached into the partial token: wait for it
        cut = len(self._released) - len(partial)
        out, self._released = self._released[:cut], self._released[cut:]
        tokens, self._complete = self._complete, []
        if out == "".join(text for text, _ in tokens):
            return out, tuple(TokenLogprob(text, logprob) for text, logprob in tokens)
        logprobs = [logprob for _, logprob in tokens]
        total = None if None in logprobs else sum(lp for lp in logprobs if lp is not None)
        return out, (TokenLogprob(out, total),)


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
        """Cache lookups and the prompt. The semantic lookup (an embedding, milliseconds of CPU) runs beside the
        prompt stage, and when it is still running once the prompt is ready, generation starts speculatively so
        its prefill overlaps the lookup; a semantic hit then drops it."""
        caches = self.caches
        cacheable = (caches.exact is not None or caches.semantic is not None) and not chat.logprobs and (
            chat.temperature == 0 or caches.cache_sampled
        )
        plan = ChatPlan("miss" if cacheable else "bypass", cacheable=cacheable)
        semantic: asyncio.Task[None] | None = None
        if not cacheable:
            timer.add("cache", 0.0)  # every stage appears in the timings, also when skipped
        try:
            if cacheable:
                with timer.stage("cache"):
                    await self._exact_lookup(chat, plan)
                if plan.cached is None and caches.semantic is not None and caches.embedder is not None and (
                    chat.messages[-1].role == "user"
                ):
                    semantic = asyncio.ensure_future(self._semantic_lookup(chat, plan, timer))
            if plan.cached is None:
                try:
                    with timer.stage("prompt"):
                        fitted = await asyncio.to_thread(
                            self.prompt.fit, model=chat.model, messages=chat.messages, documents=chat.documents,
                            count_tokens=self.llm.count_tokens, context_window=self.llm.context_window,
                            reserve_output=chat.max_tokens,
                        )
                except PromptTooLong:
                    if semantic is not None:
                        await semantic
                    if plan.cached is None:
                        raise
                else:
                    plan.prompt = fitted
                    plan.request = LlmRequest(
                        fitted.messages, max_tokens=chat.max_tokens, temperature=chat.temperature, model=chat.model,
                        top_p=chat.top_p, stop=chat.stop, seed=chat.seed, logprobs=chat.logprobs,
                        conversation_id=chat.conversation_id,
                    )
                    if semantic is not None and not semantic.done():
                        plan.start_generation(self.llm)
            if semantic is not None:
                await semantic
                if plan.cached is not None:
                    await plan.discard_generation()
                    plan.prompt = plan.request = None  # answered from the cache: no prompt was used
        except BaseException:
            if semantic is not None:
                semantic.cancel()
            await plan.discard_generation()
            raise
        CACHE_LOOKUPS.labels(result=plan.cache).inc()
        return plan

    def _cache_scope(self, chat: ChatInput, messages: list[ChatMessage]) -> dict[str, Any]:
        """Everything besides the messages that shapes the answer, so only like requests share entries."""
        return {
            "messages": [[m.role, m.content] for m in messages], "model": chat.model, "max_tokens": chat.max_tokens,
            "temperature": chat.temperature, "top_p": chat.top_p, "stop": chat.stop, "seed": chat.seed,
            "documents": chat.documents, "prompt": self.prompt.fingerprint,
        }

    async def _exact_lookup(self, chat: ChatInput, plan: ChatPlan) -> None:
        if self.caches.exact is None:
            return
        plan.exact_key = stable_hash(self._cache_scope(chat, chat.messages))
        try:
            hit = await self.caches.exact.get(plan.exact_key)
        except Exception as exc:  # a cache that is down (Redis) costs the hit, never the request
            log.warning("exact cache lookup failed, answering without it: %s", exc)
            return
        if hit is not None:
            plan.cache, plan.cached = "exact", hit

    async def _semantic_lookup(self, chat: ChatInput, plan: ChatPlan, timer: StageTimer) -> None:
        """Same preceding context (and parameters), a similar last question."""
        caches = self.caches
        assert caches.semantic is not None and caches.embedder is not None
        with timer.stage("cache"):
            try:
                plan.semantic_scope = stable_hash(self._cache_scope(chat, chat.messages[:-1]))[:32]
                vectors = await asyncio.to_thread(caches.embedder.embed, [chat.messages[-1].content])
                plan.semantic_vector = vectors[0]
                found = await caches.semantic.get(plan.semantic_scope, plan.semantic_vector,
                                                  caches.semantic_threshold)
            except Exception as exc:
                log.warning("semantic cache lookup failed, answering without it: %s", exc)
                return
        if found is not None:
            plan.cache, (plan.cached, plan.similarity) = "semantic", found

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
        logprobs = LogprobTracker() if plan.request.logprobs else None
        llm_start = plan._llm_started or time.perf_counter()
        pending_first, generation = plan._first_chunk, plan._generation or self.llm.generate(plan.request)
        plan._first_chunk = plan._generation = None  # ours now: closed below whatever happens
        try:
            async with contextlib.aclosing(generation) as chunks:
                while True:
                    try:
                        if pending_first is not None:
                            chunk, pending_first = await pending_first, None
                        else:
                            chunk = await anext(chunks)
                    except StopAsyncIteration:
                        break
                    finish_reason = finish_reason or chunk.finish_reason
                    usage = chunk.usage or usage
                    if not chunk.text:
                        continue
                    text_chunks += 1
                    if content_filter is None:
                        sent.append(chunk.text)
                        token = None if logprobs is None else (TokenLogprob(chunk.text, chunk.logprob),)
                        yield ChatDelta(chunk.text, token)
                        continue
                    filter_start = time.perf_counter()
                    result = content_filter.feed(chunk.text)
                    out, entries = result.text, None
                    if logprobs is not None:
                        logprobs.add(chunk.text, chunk.logprob)
                        out, entries = logprobs.release(result.text, content_filter.held_chars)
                    filter_ms += (time.perf_counter() - filter_start) * 1000
                    if out:
                        sent.append(out)
                        yield ChatDelta(out, entries)
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
            out, entries = rest.text, None
            if logprobs is not None:
                out, entries = logprobs.release(rest.text, 0)
            if out:
                sent.append(out)
                yield ChatDelta(out, entries)
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
