"""gRPC ``Predict`` / ``StreamPredict`` through the app's chat service: the same validation limits (``api.*``),
cache, prompt fitting and content filter as ``POST /v1/chat/completions``. A ``PredictRequest`` is mapped onto
the HTTP body model and validated by the same function; refusals are ``ApiError``s, ended with the gRPC status
their code stands for (``server.grpc_api.errors``).

Two differences, kept from before the two shared a pipeline: an unset temperature is 0 (OpenAI's HTTP default is
1), and ``model_id`` is not checked against the served models: the LLM (router) refuses a model nobody serves,
with UNAVAILABLE.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
from pydantic import ValidationError

from models.llm import LlmRequestError, LlmUnavailable
from pipelines.errors import ApiError, invalid_body
from pipelines.serving.chat import ChatDelta, ChatEnd, ChatInput
from pipelines.serving.prompt import PromptTooLong
from pipelines.serving.telemetry import StageTimer
from server.grpc_api import inference_pb2 as pb
from server.v1.chat_request import ChatCompletionBody
from server.v1.chat_service import ChatService, chat_error


def chat_body(request: pb.PredictRequest, default_model: str) -> ChatCompletionBody:
    """The request as the HTTP body it stands for (``prompt`` is one more user message)."""
    messages: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in request.messages]
    if request.prompt:
        messages.append({"role": "user", "content": request.prompt})
    if not messages:
        raise ApiError("invalid_request", "give a prompt or at least one message", param="messages")
    fields: dict[str, Any] = {
        "model": request.model_id or default_model,
        "messages": messages,
        "max_tokens": request.max_tokens or None,  # 0: api.default_max_tokens
        "temperature": request.temperature if request.HasField("temperature") else 0.0,
        "top_p": request.top_p if request.HasField("top_p") else None,
        "stop": list(request.stop) or None,
        "seed": request.seed if request.HasField("seed") else None,
        "logprobs": request.logprobs or None,
    }
    try:
        return ChatCompletionBody.model_validate(fields)
    except ValidationError as error:
        raise invalid_body(error) from None


def _usage(end: ChatEnd) -> pb.Usage:
    return pb.Usage(prompt_tokens=end.usage.prompt_tokens, completion_tokens=end.usage.completion_tokens,
                    total_tokens=end.usage.total_tokens)


def _ms_since(moment: float) -> int:
    return round((time.perf_counter() - moment) * 1000.0)


class ChatPredictor:
    """Runs Predict and StreamPredict on a ChatService."""

    def __init__(self, chat: ChatService) -> None:
        self.chat = chat

    def validate(self, request: pb.PredictRequest) -> ChatInput:
        body = chat_body(request, self.chat.settings.models.llm.model)
        chat = self.chat.validate(body, check_model=False)
        return dataclasses.replace(chat, conversation_id=request.conversation_id or None)

    async def _events(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext,
                      ) -> AsyncIterator[ChatDelta | ChatEnd]:
        """The pipeline's events; a refusal is an ``ApiError`` (the call's status: ``server.grpc_api.errors``)."""
        try:
            chat = self.validate(request)
            with self.chat.slot():
                pipeline = await self.chat.pipeline()
                plan = await pipeline.prepare(chat, StageTimer())
                try:
                    async with contextlib.aclosing(pipeline.run(plan, StageTimer())) as events:  # closing aborts
                        async for event in events:
                            yield event
                finally:
                    await plan.discard_generation()
        except (PromptTooLong, LlmRequestError, LlmUnavailable) as exc:
            raise chat_error(exc) from None

    async def predict(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext) -> pb.PredictResponse:
        received = time.perf_counter()
        text: list[str] = []
        first_token_ms, end = 0, None
        async with contextlib.aclosing(self._events(request, context)) as events:
            async for event in events:
                if isinstance(event, ChatDelta):
                    if event.text:
                        first_token_ms = first_token_ms or _ms_since(received)
                        text.append(event.text)
                else:
                    end = event
        return pb.PredictResponse(
            text="".join(text), finish_reason=end.finish_reason if end else "", usage=_usage(end) if end else None,
            model_id=request.model_id or self.chat.settings.models.llm.model, latency_ms=_ms_since(received),
            time_to_first_token_ms=first_token_ms,
        )

    async def stream(self, request: pb.PredictRequest, context: grpc.aio.ServicerContext,
                     ) -> AsyncIterator[pb.TokenResponse]:
        received = time.perf_counter()
        index, end = 0, None
        # A client that cancels cancels this coroutine; leaving the aclosing block then aborts the generation.
        async with contextlib.aclosing(self._events(request, context)) as events:
            async for event in events:
                if isinstance(event, ChatEnd):
                    end = event
                    continue
                if not event.text:
                    continue
                metadata = pb.TokenMetadata(latency_ms=_ms_since(received))
                logprobs = [t.logprob for t in event.logprobs or () if t.logprob is not None]
                if logprobs:  # the tokens this piece completes, as one log-probability
                    metadata.log_probability = sum(logprobs)
                yield pb.TokenResponse(token=event.text, index=index, metadata=metadata)
                index += 1
        yield pb.TokenResponse(index=index, is_finished=True, finish_reason=end.finish_reason if end else "",
                               usage=_usage(end) if end else None,
                               metadata=pb.TokenMetadata(latency_ms=_ms_since(received)))
