"""OpenAI-compatible chat handlers: ``POST /v1/chat/completions`` and ``GET /v1/models`` (the official SDKs work
unchanged). Auth, rate limits and size limits are the /v1 ingress's (``server.v1.ingress``); the request schema
and its validation are ``server.v1.chat_request``; the pipeline (cache, prompt, LLM, content filter) is the app's
``ChatService`` (``server.v1.chat_service``), shared with gRPC. This module only speaks HTTP: JSON or Server-Sent
Events out, and cancelling the generation when the client goes away (``server.v1.disconnects``).

Vigil's additions to OpenAI's shapes: the response field ``vigil`` (cache result, stage timings, what the prompt
stage dropped), the headers ``X-Vigil-Cache`` (exact | semantic | miss | bypass) and ``X-Vigil-Stage-Timings``
(``ingress=0.4;cache=1.1;prompt=2.0;llm=812.5;filter=0.3``, ms; for a stream, the stages done before the first
byte, the full set is in the last chunk's ``vigil`` field), and the request field ``context_documents``.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterable
from typing import Any

from aiohttp import web

from models.llm import LlmRequestError, LlmUnavailable
from pipelines.errors import ApiError
from pipelines.serving.chat import ChatDelta, ChatEnd, ChatInput, ChatPipeline, ChatPlan, TokenLogprob
from pipelines.serving.prompt import PromptTooLong
from pipelines.serving.telemetry import CHAT_REQUESTS, StageTimer
from server.config import Settings
from server.http.errors import openai_error_body, read_json_body
from server.v1.chat_request import ChatCompletionBody
from server.v1.chat_service import CHAT_SERVICE, ChatService, chat_error, collect
from server.v1.disconnects import DISCONNECTS, ClientDisconnected, DisconnectWatcher
from server.v1.ingress import STAGE_TIMER
from server.v1.sse import SSE_DONE, sse_event

DOCUMENT_SOURCES = web.RequestKey("vigil_document_sources", list)  # chunks retrieved from a collection


def _api(request: web.Request) -> ChatService:
    return request.app[CHAT_SERVICE]


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


async def chat_completions(request: web.Request) -> web.StreamResponse:
    api, disconnects = _api(request), request.app[DISCONNECTS]
    timer: StageTimer = request[STAGE_TIMER]
    with timer.stage("ingress"):
        body = await read_json_body(request, ChatCompletionBody, require_content_type=False)
        await api.discover_models()
        chat = api.validate(body)
        if api.document_retriever is not None:  # a document collection (server/records/memory.py)
            chat, request[DOCUMENT_SOURCES] = await api.document_retriever(body.model_dump(), chat)
    with api.slot():
        return await _complete(request, api, disconnects, body, chat, timer)


async def _complete(request: web.Request, api: ChatService, disconnects: DisconnectWatcher,
                    body: ChatCompletionBody, chat: ChatInput, timer: StageTimer) -> web.StreamResponse:
    outcome = "error"
    plan: ChatPlan | None = None
    try:
        pipeline = await api.pipeline()
        try:
            plan = await disconnects.run(request, pipeline.prepare(chat, timer))
        except (PromptTooLong, LlmRequestError, LlmUnavailable) as exc:
            raise chat_error(exc) from exc
        completion_id = f"chatcmpl-{uuid.uuid4().hex}"
        headers = {"X-Vigil-Cache": plan.cache}
        if body.stream:
            response, outcome = await _stream(request, pipeline, plan, chat, body, timer, completion_id, headers)
            return response
        try:
            text, token_logprobs, end = await disconnects.run(request, collect(pipeline.run(plan, timer)))
        except (LlmRequestError, LlmUnavailable) as exc:
            raise chat_error(exc) from exc
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
        CHAT_REQUESTS.labels(outcome=outcome).inc()
        timer.observe()


def _logprobs_field(tokens: Iterable[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's ``choices[i].logprobs``; no alternatives (top_logprobs 0)."""
    return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()), "top_logprobs": []}
                        for t in tokens], "refusal": None}


async def _stream(
    request: web.Request, pipeline: ChatPipeline, plan: ChatPlan, chat: ChatInput, body: ChatCompletionBody,
    timer: StageTimer, completion_id: str, headers: dict[str, str],
) -> tuple[web.StreamResponse, str]:
    """Server-Sent Events in OpenAI's chunk format. Returns the response and the outcome for the metrics.

    The status line waits for the first piece of the answer, so a backend that fails before answering still
    gets a proper error status; a failure after that is reported in the stream (OpenAI's ``{"error": ...}``)."""
    disconnects = request.app[DISCONNECTS]
    created = int(time.time())
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    events = pipeline.run(plan, timer)
    try:
        try:
            first: ChatDelta | ChatEnd | None = await disconnects.run(request, anext(events))
        except StopAsyncIteration:
            first = None
        except (LlmRequestError, LlmUnavailable) as exc:
            raise chat_error(exc) from exc
        headers["X-Vigil-Stage-Timings"] = timer.header()  # the stages before the first byte; all at the end
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                               **headers})
        await response.prepare(request)

        def chunk(delta: dict[str, Any], finish_reason: str | None = None,
                  logprobs: dict[str, Any] | None = None, **extra: Any) -> bytes:
            return sse_event({"id": completion_id, "object": "chat.completion.chunk", "created": created,
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
                await response.write(sse_event({"id": completion_id, "object": "chat.completion.chunk",
                                           "created": created, "model": chat.model, "choices": [],
                                           "usage": _usage(event)}))
            await response.write(SSE_DONE)
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
                await response.write(sse_event(openai_error_body(chat_error(exc))))
            return "error"

        try:
            outcome = await disconnects.run(request, send_all())
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
        raise ApiError("model_not_found", f"the model {model!r} does not exist here", param="model")
    return web.json_response(_model_card(api, model))


def _model_card(api: ChatService, model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": api.created, "owned_by": "vigil"}


# ---------------------------------------------------------------- wiring


def mount_chat(app: web.Application, settings: Settings, api: ChatService, disconnects: DisconnectWatcher) -> None:
    """The chat service preloaded on start-up (``api.chat`` and ``api.preload``); the disconnect watcher closed on
    cleanup. (The routes: ``server.v1.routes``.)"""

    async def preload(app: web.Application) -> None:
        if settings.api.chat and settings.api.preload:
            await api.load()  # a missing model stops start-up with its how-to message

    async def close(app: web.Application) -> None:
        await disconnects.close()

    app.on_startup.append(preload)
    app.on_cleanup.append(close)
