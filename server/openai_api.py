"""OpenAI-compatible HTTP API: ``POST /v1/chat/completions`` and ``GET /v1/models`` (the official SDKs work
unchanged), plus the ingress middleware that guards every ``/v1/`` path (API keys, per-key sliding-window rate
limit).

The pipeline itself (cache, prompt, LLM, content filter) lives in ``pipelines.serving``; this module only speaks
HTTP: validation with OpenAI-shaped 4xx errors, JSON or Server-Sent Events out, and cancelling the generation
when the client goes away. The chat models load on the first request (or at start-up with ``api.preload``).

Vigil's additions to OpenAI's shapes: the response field ``vigil`` (cache result, stage timings, what the prompt
stage dropped), the headers ``X-Vigil-Cache`` (exact | semantic | miss | bypass) and ``X-Vigil-Stage-Timings``
(``ingress=0.4;cache=1.1;prompt=2.0;llm=812.5;filter=0.3``, ms; for a stream, the stages done before the first
byte, the full set is in the last chunk's ``vigil`` field), and the request field ``context_documents``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError

from models.embeddings import TextEmbedder
from models.llm import ChatMessage, LanguageModel, LlmRequestError, LlmUnavailable
from models.packaged import ModelNotAvailable
from models.router import ANY_MODEL, RoutedLlm
from pipelines.serving.cache import (
    InProcessExactCache,
    InProcessSemanticCache,
    RedisExactCache,
    RedisSemanticCache,
)
from pipelines.serving.chat import CacheConfig, ChatDelta, ChatEnd, ChatInput, ChatPipeline, ChatPlan, TokenLogprob
from pipelines.serving.content_filter import StreamingContentFilter
from pipelines.serving.prompt import PromptBuilder, PromptTooLong
from pipelines.serving.ratelimit import InProcessRateLimiter, RateLimiter, RedisRateLimiter
from pipelines.serving.telemetry import CHAT_REQUESTS, RATE_LIMITED, StageTimer
from server.auth import presented_token
from server.config import RateLimit, Settings
from server.errors import Handler, json_error_reason
from server.openai_errors import OpenAiApiError

log = logging.getLogger(__name__)

API_PREFIX = "/v1/"
ROLES = {"system", "user", "assistant", "developer"}  # developer: OpenAI's newer name for system

T = TypeVar("T")
STAGE_TIMER = web.RequestKey("vigil_stage_timer", StageTimer)
API_IDENTITY = web.RequestKey("vigil_api_identity", str)  # "key:<name>", "token" or "ip:<address>"
DOCUMENT_SOURCES = web.RequestKey("vigil_document_sources", list)  # chunks retrieved from a collection


# ---------------------------------------------------------------- request bodies


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # SDKs send fields we do not use (user, metadata, ...)


class InMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Body):
    include_usage: StrictBool = False


class ChatCompletionBody(_Body):
    """Numbers and booleans are strict, as OpenAI's are: ``"max_tokens": "10"`` or ``"stream": "yes"`` is a 400."""

    model: StrictStr
    messages: list[InMessage]
    max_tokens: StrictInt | None = None
    max_completion_tokens: StrictInt | None = None
    temperature: StrictFloat | None = None  # strict floats still take integers (1 is 1.0), as JSON numbers
    top_p: StrictFloat | None = None
    n: StrictInt | None = None
    stream: StrictBool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: StrictInt | None = None
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = None
    context_documents: list[str] | None = None  # Vigil's extension: reference texts for the system prompt


UNSUPPORTED_FIELDS = ("tools", "functions", "tool_choice", "function_call", "audio", "prediction")


def _invalid(message: str, param: str | None, code: str | None = None) -> OpenAiApiError:
    return OpenAiApiError(400, message, param=param, code=code)


# ---------------------------------------------------------------- the API's state


@dataclass
class ApiKeyEntry:
    name: str
    secret: bytes
    rate_limit: RateLimit | None


class ChatApi:
    """What the /v1 endpoints share: keys, the rate limiter, and the chat pipeline (built lazily)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        api = settings.api
        self.keys = [ApiKeyEntry(k.name, k.key.get_secret_value().encode(), k.rate_limit) for k in api.keys]
        self.fallback_token = settings.auth.token.get_secret_value().encode() if settings.auth.token else None
        self.created = int(time.time())
        self.redis: Any = None
        if settings.redis.url is not None:
            import redis.asyncio as aioredis

            self.redis = aioredis.from_url(settings.redis.url.get_secret_value())
        self.limiter: RateLimiter = (
            RedisRateLimiter(self.redis, settings.redis.key_prefix) if self.redis is not None
            else InProcessRateLimiter()
        )
        self.in_flight = 0
        self.disconnects = DisconnectWatcher(api.disconnect_poll_s)
        self._pipeline: ChatPipeline | None = None
        self._loading = asyncio.Lock()
        self._llm_for_test: LanguageModel | None = None
        # (raw body, chat) -> (chat with retrieved documents, their sources): a document collection (server/memory.py)
        self.document_retriever: Callable[[dict[str, Any], ChatInput],
                                          Awaitable[tuple[ChatInput, list[dict[str, Any]]]]] | None = None

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
            raise OpenAiApiError(503, f"the chat model is not available: {exc}", type="server_error",
                                 code="model_unavailable") from exc

    def _build_pipeline(self) -> ChatPipeline:
        from server.engines import build_embedder, build_llm  # deferred: loads models

        settings, config = self.settings, self.settings.api
        if self._llm_for_test is not None:
            llm = self._llm_for_test
        else:
            llm = build_llm(settings)  # shared: the app closes it (server.engines.close_shared_llm)
        cache_settings = config.cache
        prefix = settings.redis.key_prefix
        caches = CacheConfig(semantic_threshold=cache_settings.semantic_threshold,
                             cache_sampled=cache_settings.cache_sampled)
        if cache_settings.exact:
            caches.exact = (RedisExactCache(self.redis, cache_settings.ttl_s, prefix) if self.redis is not None
                            else InProcessExactCache(cache_settings.ttl_s, cache_settings.max_entries))
        if cache_settings.semantic:
            embedder: TextEmbedder = build_embedder(settings)
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

    async def close(self) -> None:
        await self.disconnects.close()
        await self.limiter.close()
        if self.redis is not None:
            await self.redis.aclose()

    # ------------------------------------------------------------ ingress

    def identify(self, request: web.Request) -> tuple[str, RateLimit | None]:
        """(rate-limit identity, limit) of the caller, or a 401."""
        default_limit = self.settings.api.rate_limit
        given = presented_token(request)
        if self.keys or self.fallback_token is not None:
            if not given:
                raise OpenAiApiError(401, "missing API key: send 'Authorization: Bearer <key>'",
                                     code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
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
            raise OpenAiApiError(401, "incorrect API key", code="invalid_api_key",
                                 headers={"WWW-Authenticate": "Bearer"})
        return f"ip:{request.remote}", default_limit  # open server: limit per client address

    def middleware(self) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
        @web.middleware
        async def ingress(request: web.Request, handler: Handler) -> web.StreamResponse:
            if not request.path.startswith(API_PREFIX):
                return await handler(request)
            timer = StageTimer()
            request[STAGE_TIMER] = timer
            with timer.stage("ingress"):
                identity, limit = self.identify(request)
                request[API_IDENTITY] = identity
                if limit is not None:
                    try:
                        decision = await self.limiter.hit(identity, limit.requests, limit.window_s)
                    except Exception as exc:  # Redis down: refuse rather than run unlimited
                        log.warning("rate limiter unavailable: %s", exc)
                        raise OpenAiApiError(503, "rate limiter unavailable, try again shortly", type="server_error",
                                             code="rate_limiter_unavailable", headers={"Retry-After": "1"}) from exc
                    if not decision.allowed:
                        RATE_LIMITED.labels(key=identity.partition(":")[2] if identity.startswith("key:")
                                            else identity.partition(":")[0]).inc()
                        raise OpenAiApiError(
                            429, f"rate limit reached: {limit.requests} requests per {limit.window_s:g} s; retry "
                            f"in {decision.retry_after_s:.1f} s", code="rate_limit_exceeded",
                            headers={"Retry-After": str(max(1, math.ceil(decision.retry_after_s))),
                                     "X-RateLimit-Limit-Requests": str(limit.requests),
                                     "X-RateLimit-Remaining-Requests": "0"},
                        )
            return await handler(request)

        return ingress


CHAT_API = web.AppKey("chat_api", ChatApi)


def _api(request: web.Request) -> ChatApi:
    return request.app[CHAT_API]


# ---------------------------------------------------------------- validation


def _message_text(message: InMessage, index: int) -> str:
    content = message.content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise _invalid(f"messages[{index}].content: only text parts are supported (got type "
                               f"{part.get('type')!r})", f"messages[{index}].content")
            parts.append(part["text"])
        content = "".join(parts)
    if content is None or not content.strip():
        raise _invalid(f"messages[{index}].content must be a non-empty string", f"messages[{index}].content")
    return content


def validate_chat(body: ChatCompletionBody, raw: dict[str, Any], api: ChatApi) -> ChatInput:
    config = api.settings.api
    for name in UNSUPPORTED_FIELDS:
        if raw.get(name) is not None:
            raise _invalid(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    response_format = raw.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise _invalid("only response_format {'type': 'text'} is supported", "response_format",
                       "unsupported_parameter")
    served = api.served_models()
    if body.model not in served:  # OpenAI answers an unknown model with 404 model_not_found
        raise OpenAiApiError(404, f"the model {body.model!r} does not exist here; choose one of {served}",
                             type="invalid_request_error", param="model", code="model_not_found")
    if not body.messages:
        raise _invalid("messages must contain at least one message", "messages")
    if len(body.messages) > config.max_messages:
        raise _invalid(f"too many messages: {len(body.messages)} > {config.max_messages}", "messages",
                       "too_many_messages")
    messages: list[ChatMessage] = []
    for index, message in enumerate(body.messages):
        if message.role not in ROLES:
            raise _invalid(f"messages[{index}].role must be one of system, user, assistant (got "
                           f"{message.role!r})", f"messages[{index}].role")
        text = _message_text(message, index)
        if len(text) > config.max_message_chars:
            raise _invalid(f"messages[{index}].content is longer than {config.max_message_chars} characters",
                           f"messages[{index}].content")
        messages.append(ChatMessage("system" if message.role == "developer" else message.role, text))  # type: ignore[arg-type]
    if all(m.role == "system" for m in messages):
        raise _invalid("messages must include at least one user or assistant message", "messages")
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = min(config.default_max_tokens, config.max_output_tokens)
    elif not 1 <= max_tokens <= config.max_output_tokens:
        raise _invalid(f"{param} must be between 1 and {config.max_output_tokens} (got {max_tokens})", param)
    temperature = 1.0 if body.temperature is None else body.temperature  # OpenAI's default
    if not 0 <= temperature <= 2:
        raise _invalid(f"temperature must be between 0 and 2 (got {temperature})", "temperature")
    if body.top_p is not None and not 0 < body.top_p <= 1:
        raise _invalid(f"top_p must be in (0, 1] (got {body.top_p})", "top_p")
    if body.n not in (None, 1):
        raise _invalid("only n = 1 is supported", "n", "unsupported_parameter")
    if body.top_logprobs is not None:
        if not body.logprobs:
            raise _invalid("top_logprobs requires logprobs: true", "top_logprobs")
        if body.top_logprobs != 0:  # llama.cpp's streamed chunks carry no alternatives to report
            raise _invalid(f"only top_logprobs 0 is supported (got {body.top_logprobs})", "top_logprobs",
                           "unsupported_parameter")
    if body.stream_options is not None and not body.stream:
        raise _invalid("stream_options is only allowed with stream: true", "stream_options")
    stop = [body.stop] if isinstance(body.stop, str) else body.stop
    if stop is not None and (len(stop) > 4 or not all(stop)):
        raise _invalid("stop takes at most 4 non-empty strings", "stop")
    documents = body.context_documents or []
    if len(documents) > config.prompt.max_context_documents:
        raise _invalid(f"too many context_documents: {len(documents)} > {config.prompt.max_context_documents}",
                       "context_documents")
    if any(len(d) > config.max_message_chars for d in documents):
        raise _invalid(f"a context document is longer than {config.max_message_chars} characters",
                       "context_documents")
    return ChatInput(messages, body.model, max_tokens, temperature, body.top_p, stop or None, body.seed, documents,
                     logprobs=bool(body.logprobs))


async def _read_chat_body(request: web.Request) -> tuple[ChatCompletionBody, dict[str, Any]]:
    try:
        raw = await request.json()
    except web.HTTPRequestEntityTooLarge:
        raise OpenAiApiError(413, "request body too large", code="body_too_large") from None
    except (ValueError, RecursionError) as error:
        raise _invalid(f"body is not valid JSON: {json_error_reason(error)}", None, "invalid_json") from None
    if not isinstance(raw, dict):
        raise _invalid("body must be a JSON object", None)
    try:
        return ChatCompletionBody.model_validate(raw), raw
    except ValidationError as error:
        item = error.errors()[0]
        loc = item["loc"]
        param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
        raise _invalid(f"{param or 'body'}: {item['msg']}", param) from None


# ---------------------------------------------------------------- disconnects


def _client_gone(request: web.Request) -> bool:
    transport = request.transport
    return transport is None or transport.is_closing()


class ClientDisconnected(Exception):
    pass


class DisconnectWatcher:
    """Cancels a request's work when its client goes away.

    aiohttp does not cancel handlers when the client leaves (handler_cancellation is off) and offers no event for
    it, so transports are polled; but by one timer for every request in flight, not one per request: on a small
    machine each wake-up of this thread can stall llama.cpp's decoding threads, and per-request pollers made those
    wake-ups grow with concurrency (the pipeline overhead at concurrency 8). The timer stops while nothing is
    watched."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._watched: dict[asyncio.Future[Any], web.Request] = {}
        self._left: set[asyncio.Future[Any]] = set()  # work cancelled because its client went away
        self._poller: asyncio.Task[None] | None = None

    async def run(self, request: web.Request, work: Awaitable[T]) -> T:
        """Await ``work``; cancel it (and so the generation) and raise ClientDisconnected if the client leaves."""
        task = asyncio.ensure_future(work)
        self._watched[task] = request
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="chat-api:disconnects")
        try:
            return await task  # cancelling this await (server shutdown) cancels the work too
        except asyncio.CancelledError:
            if task in self._left:
                raise ClientDisconnected() from None
            raise
        finally:
            self._watched.pop(task, None)
            self._left.discard(task)

    async def _poll(self) -> None:
        while self._watched:
            await asyncio.sleep(self.interval_s)
            for task, request in list(self._watched.items()):
                if not task.done() and _client_gone(request):
                    self._left.add(task)
                    task.cancel()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)


# ---------------------------------------------------------------- handlers


def _vigil_field(plan: ChatPlan, timer: StageTimer, request: web.Request) -> dict[str, Any]:
    extra: dict[str, Any] = {"cache": plan.cache, "stage_timings_ms": timer.rounded()}
    if request.get(DOCUMENT_SOURCES):
        extra["sources"] = request[DOCUMENT_SOURCES]
    if plan.similarity is not None:
        extra["similarity"] = round(plan.similarity, 4)
    if plan.prompt is not None:
        extra["prompt"] = {"tokens": plan.prompt.prompt_tokens, "dropped_messages": plan.prompt.dropped_messages,
                           "dropped_documents": plan.prompt.dropped_documents}
    return extra


def _usage(end: ChatEnd) -> dict[str, int]:
    return {"prompt_tokens": end.usage.prompt_tokens, "completion_tokens": end.usage.completion_tokens,
            "total_tokens": end.usage.total_tokens}


def _error_for(exc: Exception) -> OpenAiApiError:
    if isinstance(exc, PromptTooLong):
        return _invalid(str(exc), "messages", "context_length_exceeded")
    if isinstance(exc, LlmRequestError):
        return _invalid(f"the model rejected the request: {exc}", None, "upstream_rejected")
    return OpenAiApiError(503, f"the model is unavailable: {exc}", type="server_error", code="model_unavailable",
                          headers={"Retry-After": "1"})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    api = _api(request)
    timer: StageTimer = request[STAGE_TIMER]
    with timer.stage("ingress"):
        body, raw = await _read_chat_body(request)
        await api.discover_models()
        chat = validate_chat(body, raw, api)
        if api.document_retriever is not None:
            chat, request[DOCUMENT_SOURCES] = await api.document_retriever(raw, chat)
    if api.in_flight >= api.settings.api.max_in_flight:
        raise OpenAiApiError(503, "too many requests in flight, try again shortly", type="server_error",
                             code="server_busy", headers={"Retry-After": "1"})
    api.in_flight += 1
    outcome = "error"
    plan: ChatPlan | None = None
    try:
        pipeline = await api.pipeline()
        try:
            plan = await api.disconnects.run(request, pipeline.prepare(chat, timer))
        except (PromptTooLong, LlmRequestError, LlmUnavailable) as exc:
            raise _error_for(exc) from exc
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        headers = {"X-Vigil-Cache": plan.cache}
        if body.stream:
            response, outcome = await _stream(request, pipeline, plan, chat, body, timer, completion_id, headers)
            return response
        try:
            text, token_logprobs, end = await api.disconnects.run(request, _collect(pipeline.run(plan, timer)))
        except (LlmRequestError, LlmUnavailable) as exc:
            raise _error_for(exc) from exc
        outcome = end.finish_reason
        headers["X-Vigil-Stage-Timings"] = timer.header()
        return web.json_response({
            "id": completion_id, "object": "chat.completion", "created": int(time.time()), "model": chat.model,
            "system_fingerprint": None,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": end.finish_reason,
                         "logprobs": _logprobs_field(token_logprobs) if chat.logprobs else None}],
            "usage": _usage(end), "vigil": _vigil_field(plan, timer, request),
        }, headers=headers)
    except ClientDisconnected:
        outcome = "disconnected"
        return web.Response(status=499)  # nobody reads it; nginx's "client closed request"
    finally:
        if plan is not None:
            await plan.discard_generation()  # a speculative generation nobody took over (no-op otherwise)
        api.in_flight -= 1
        CHAT_REQUESTS.labels(outcome=outcome).inc()
        timer.observe()


def _logprobs_field(tokens: Iterable[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's ``choices[i].logprobs``; no alternatives (top_logprobs 0)."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()), "top_logprobs": []}
                        for t in tokens], "refusal": None}


async def _collect(events: AsyncIterator[ChatDelta | ChatEnd]) -> tuple[str, list[TokenLogprob], ChatEnd]:
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


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode() + b"\n\n"


async def _stream(
    request: web.Request, pipeline: ChatPipeline, plan: ChatPlan, chat: ChatInput, body: ChatCompletionBody,
    timer: StageTimer, completion_id: str, headers: dict[str, str],
) -> tuple[web.StreamResponse, str]:
    """Server-Sent Events in OpenAI's chunk format. Returns the response and the outcome for the metrics.

    The status line waits for the first piece of the answer, so a backend that fails before answering still
    gets a proper error status; a failure after that is reported in the stream (OpenAI's ``{"error": ...}``)."""
    api = _api(request)
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = pipeline.run(plan, timer)
    try:
        try:
            first: ChatDelta | ChatEnd | None = await api.disconnects.run(request, anext(events))
        except StopAsyncIteration:
            first = None
        except (LlmRequestError, LlmUnavailable) as exc:
            raise _error_for(exc) from exc
        headers["X-Vigil-Stage-Timings"] = timer.header()  # the stages before the first byte; all at the end
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **headers})
        await response.prepare(request)

        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: dict[str, Any] | None = None, **extra: Any) -> bytes:
            return _sse({"id": completion_id, "object": "chat.completion.chunk", "created": created,
                         "model": chat.model, "system_fingerprint": None,
                         "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason,
                                      "logprobs": logprobs}],
                         **extra})

        # A text chunk is the same JSON each time but for its content: encode the rest once, not per token.
        head, _, tail = chunk({"content": ""}).rpartition(b'""')

        async def send(event: ChatDelta | ChatEnd) -> str | None:
            if isinstance(event, ChatDelta):
                if event.text and chat.logprobs:
                    await response.write(chunk({"content": event.text}, logprobs=_logprobs_field(event.logprobs or ())))
                elif event.text:
                    await response.write(head + json.dumps(event.text, ensure_ascii=False).encode() + tail)
                return None
            await response.write(chunk({}, event.finish_reason, vigil=_vigil_field(plan, timer, request)))
            if include_usage:
                await response.write(_sse({"id": completion_id, "object": "chat.completion.chunk",
                                           "created": created, "model": chat.model, "choices": [],
                                           "usage": _usage(event)}))
            await response.write(b"data: [DONE]\n\n")
            return event.finish_reason

        async def send_all() -> str:
            await response.write(chunk({"role": "assistant", "content": ""}))
            try:
                if first is not None and (finished := await send(first)) is not None:
                    return finished
                async for event in events:
                    if (finished := await send(event)) is not None:
                        return finished
            except (LlmRequestError, LlmUnavailable) as exc:  # the status is sent already: report in the stream
                await response.write(b"data: " + _error_for(exc).text.encode() + b"\n\n")
            return "error"

        try:
            outcome = await api.disconnects.run(request, send_all())
        except (ClientDisconnected, ConnectionResetError):
            return response, "disconnected"
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response, outcome
    finally:
        await events.aclose()  # closes the generation if it is still running


async def list_models(request: web.Request) -> web.Response:
    api = _api(request)
    await api.discover_models()
    return web.json_response({"object": "list", "data": [_model_card(api, m) for m in api.served_models()]})


async def get_model(request: web.Request) -> web.Response:
    api = _api(request)
    model = request.match_info["model"]
    await api.discover_models()
    if model not in api.served_models():
        raise OpenAiApiError(404, f"the model {model!r} does not exist here", type="invalid_request_error",
                             param="model", code="model_not_found")
    return web.json_response(_model_card(api, model))


def _model_card(api: ChatApi, model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": api.created, "owned_by": "vigil"}


# ---------------------------------------------------------------- wiring


def setup_openai_api(app: web.Application, settings: Settings) -> ChatApi:
    """Add the /v1 ingress middleware (every /v1/ route, present or added later) and the chat routes."""
    api = ChatApi(settings)
    app[CHAT_API] = api
    app.middlewares.append(api.middleware())
    if settings.api.chat:
        app.router.add_post("/v1/chat/completions", chat_completions)
        app.router.add_get("/v1/models", list_models)
        app.router.add_get("/v1/models/{model}", get_model)

    async def preload(app: web.Application) -> None:
        if settings.api.chat and settings.api.preload:
            await api.load()  # a missing model stops start-up with its how-to message

    async def close(app: web.Application) -> None:
        await api.close()

    app.on_startup.append(preload)
    app.on_cleanup.append(close)
    return api

