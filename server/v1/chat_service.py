"""The chat service behind every chat entrypoint (HTTP ``/v1/chat/completions`` and gRPC ``Predict``): one
``ChatPipeline`` per app, its served models, and the in-flight limit. Transport-free but for its app key."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

from aiohttp import web

from models.embeddings import TextEmbedder
from models.llm import LanguageModel, LlmRequestError, LlmUnavailable
from models.llm.router import ANY_MODEL, RoutedLlm
from models.packaged import ModelNotAvailable
from pipelines.errors import ApiError
from pipelines.serving.cache import (
    InProcessExactCache,
    InProcessSemanticCache,
    RedisExactCache,
    RedisSemanticCache,
)
from pipelines.serving.chat import CacheConfig, ChatDelta, ChatEnd, ChatInput, ChatPipeline, TokenLogprob
from pipelines.serving.content_filter import StreamingContentFilter
from pipelines.serving.prompt import PromptBuilder, PromptTooLong
from server.config import Settings
from server.engines import Engines
from server.v1.chat_request import ChatCompletionBody, validate_chat

# (raw body, chat) -> (chat with retrieved documents, their sources)
DocumentRetriever = Callable[[dict[str, Any], ChatInput], Awaitable[tuple[ChatInput, list[dict[str, Any]]]]]


class ChatService:
    """The chat pipeline (cache, prompt fitting, LLM, content filter; built on first use or at start-up with
    ``api.preload``), the models it serves and the in-flight limit: shared by ``/v1/chat/completions`` and gRPC
    ``Predict``/``StreamPredict``, so both apply the same limits, cache and filter."""

    def __init__(self, settings: Settings, engines: Engines, redis: Any = None,
                 document_retriever: DocumentRetriever | None = None) -> None:
        self.settings = settings
        self.engines = engines
        self.redis = redis  # the app's (server.v1.shared_redis); None: in-process caches
        self.created = int(time.time())
        self.in_flight = 0
        self._pipeline: ChatPipeline | None = None
        self._loading = asyncio.Lock()
        self._llm_for_test: LanguageModel | None = None
        self.document_retriever = document_retriever  # a request's document collection (server/records/memory.py)

    def served_models(self) -> list[str]:
        """Model ids clients may ask for. With the router's upstreams: the union of the models each upstream is
        configured with (or, once the router ran its first health check, discovered), plus ``api.served_models``;
        otherwise ``api.served_models`` or else ``models.llm.model``."""
        llm_config = self.settings.models.llm
        names = list(self.settings.api.served_models)
        if llm_config.backend == "openai" and llm_config.upstreams:
            if llm_config.base_url:  # the plain base_url upstream serves the default model name
                names.append(llm_config.model)
            for upstream in llm_config.upstreams:
                names.extend(m for m in upstream.models if m != ANY_MODEL)
            router = self._pipeline.llm if self._pipeline is not None else None
            if isinstance(router, RoutedLlm):  # upstreams without configured models list what they discovered
                names.extend(sorted(m for u in router.upstreams for m in u.models if m != ANY_MODEL))
        elif not names:
            names.append(llm_config.model)
        return list(dict.fromkeys(names))  # the union, in order, without repeats

    async def discover_models(self) -> None:
        """When an upstream is configured without its models, they are known only from its GET /v1/models: build
        the router and let it run its first health check (once) before the served models are listed or checked."""
        llm_config = self.settings.models.llm
        if llm_config.backend != "openai" or all(u.models for u in llm_config.upstreams):
            return
        pipeline = await self.pipeline()
        if isinstance(pipeline.llm, RoutedLlm):
            await pipeline.llm.start()

    def use_llm_for_test(self, llm: LanguageModel) -> None:
        """Test seam: serve this LanguageModel (e.g. a ScriptedLlmForTest) instead of the configured one."""
        if self._pipeline is not None:
            raise RuntimeError("the chat pipeline is already built")
        self._llm_for_test = llm

    @property
    def pipeline_if_loaded(self) -> ChatPipeline | None:
        return self._pipeline

    async def load(self) -> ChatPipeline:
        """Build the pipeline once (loads the models in a thread); raises ModelNotAvailable / LlmUnavailable."""
        async with self._loading:
            if self._pipeline is None:
                self._pipeline = await asyncio.to_thread(self._build_pipeline)
        return self._pipeline

    async def pipeline(self) -> ChatPipeline:
        if self._pipeline is not None:
            return self._pipeline
        try:
            return await self.load()
        except (ModelNotAvailable, LlmUnavailable) as exc:
            raise ApiError("model_unavailable", f"the chat model is not available: {exc}") from exc

    def _build_pipeline(self) -> ChatPipeline:
        settings, config = self.settings, self.settings.api
        if self._llm_for_test is not None:
            llm = self._llm_for_test
        else:
            llm = self.engines.llm()  # the app's: it closes it (Engines.close)
        cache_settings = config.cache
        prefix = settings.redis.key_prefix
        caches = CacheConfig(semantic_threshold=cache_settings.semantic_threshold,
                             cache_sampled=cache_settings.cache_sampled)
        if cache_settings.exact:
            caches.exact = (RedisExactCache(self.redis, cache_settings.ttl_s, prefix) if self.redis is not None
                            else InProcessExactCache(cache_settings.ttl_s, cache_settings.max_entries))
        if cache_settings.semantic:
            embedder: TextEmbedder = self.engines.embedder()
            caches.embedder = embedder
            caches.semantic = (
                RedisSemanticCache(self.redis, cache_settings.ttl_s, cache_settings.max_entries, prefix)
                if self.redis is not None else InProcessSemanticCache(cache_settings.ttl_s, cache_settings.max_entries)
            )
        filter_settings = config.content_filter
        new_filter = None
        if filter_settings.enabled and (filter_settings.mask_pii or filter_settings.block_patterns):
            def new_filter() -> StreamingContentFilter:
                return StreamingContentFilter(list(filter_settings.mask_pii), list(filter_settings.block_patterns),
                                              filter_settings.max_hold_chars)
        prompt = PromptBuilder(config.prompt.system_template, config.prompt.model_templates)
        return ChatPipeline(llm, prompt, caches, new_filter)

    def validate(self, body: ChatCompletionBody, *, check_model: bool = True) -> ChatInput:
        return validate_chat(body, self.settings.api, self.served_models() if check_model else None)

    @contextlib.contextmanager
    def slot(self) -> Iterator[None]:
        """One of ``api.max_in_flight`` generations, or ``server_busy``."""
        if self.in_flight >= self.settings.api.max_in_flight:
            raise ApiError("server_busy", "too many requests in flight, try again shortly", retry_after_s=1)
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


def chat_error(exc: Exception) -> ApiError:
    """What the pipeline raises, as the client's error."""
    if isinstance(exc, PromptTooLong):
        return ApiError("context_length_exceeded", str(exc), param="messages")
    if isinstance(exc, LlmRequestError):
        return ApiError("upstream_rejected", f"the model rejected the request: {exc}")
    return ApiError("model_unavailable", f"the model is unavailable: {exc}", retry_after_s=1)


async def collect(events: AsyncIterator[ChatDelta | ChatEnd]) -> tuple[str, list[TokenLogprob], ChatEnd]:
    pieces: list[str] = []
    token_logprobs: list[TokenLogprob] = []
    async with contextlib.aclosing(events) as stream:
        async for event in stream:
            if isinstance(event, ChatDelta):
                pieces.append(event.text)
                token_logprobs.extend(event.logprobs or ())
            else:
                return "".join(pieces), token_logprobs, event
    raise LlmUnavailable("the answer ended without a finish")


CHAT_SERVICE = web.AppKey("chat_service", ChatService)
