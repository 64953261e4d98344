"""A chat request, as every entrypoint of the chat pipeline receives it: the body of ``POST /v1/chat/completions``
(OpenAI's shape; gRPC's ``PredictRequest`` is mapped onto it) and its validation against the ``api.*`` limits.
The result is the pipeline's ``ChatInput``; a refusal is an ``ApiError`` naming the parameter at fault."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictInt, StrictStr

from models.llm import ChatMessage
from pipelines.errors import ApiError
from pipelines.serving.chat import ChatInput
from server.config.api import ApiSettings

ROLES = {"system", "user", "assistant", "developer"}  # developer: OpenAI's newer name for system


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")  # SDKs send fields we do not use (user, metadata, ...)


class InMessage(_Body):
    role: str
    content: str | list[dict[str, Any]] | None = None


class StreamOptions(_Body):
    include_usage: StrictBool = False


class ChatCompletionBody(_Body):
    model_config = ConfigDict(extra="allow")  # kept, to refuse the fields we do not support (UNSUPPORTED_FIELDS)

    # Numbers and booleans are strict, as OpenAI's are: "max_tokens": "10" or "stream": "yes" is a 400.
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


def _invalid(message: str, param: str | None, code: str = "invalid_request") -> ApiError:
    return ApiError(code, message, param=param)


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


def validate_chat(body: ChatCompletionBody, config: ApiSettings, served: list[str] | None) -> ChatInput:
    """The request as the chat pipeline's input, or an ApiError naming the parameter at fault. ``config`` holds
    the limits (``api.*``: every entrypoint of the chat pipeline applies the same ones); ``served``: the model
    names clients may ask for (None: the LLM decides, as gRPC's router does)."""
    raw = body.model_extra or {}
    for name in UNSUPPORTED_FIELDS:
        if raw.get(name) is not None:
            raise _invalid(f"'{name}' is not supported by this server", name, "unsupported_parameter")
    response_format = raw.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") not in (None, "text"):
        raise _invalid("only response_format {'type': 'text'} is supported", "response_format",
                       "unsupported_parameter")
    if served is not None and body.model not in served:  # OpenAI answers an unknown model with 404 model_not_found
        raise ApiError("model_not_found", f"the model {body.model!r} does not exist here; choose one of {served}",
                       param="model")
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
