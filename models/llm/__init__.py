"""Chat LLMs: the streaming protocol every backend follows, its message types, and the registry of backends, one
module each in this package declaring its config, its builder and its code:

* ``embedded``: a GGUF model in-process on xllamacpp (llama.cpp's own server code without the HTTP hop);
* ``openai``: OpenAI-compatible upstreams (vLLM, llama.cpp's server, ...) behind one router (``router``), each
  streamed over HTTP by ``openai_chat.OpenAiLlm``.

``openai_chat`` is the OpenAI chat-completions format both speak (llama.cpp's in-process server answers in it
too); ``prometheus`` reads a server's ``/metrics``. Heavy imports (xllamacpp) stay inside the builders and models,
so loading the config stays cheap.

Backends stream ``TokenChunk``s from ``generate`` (text delta, log-probability when asked for, finish reason, and
the backend's token usage at the end); ``stream`` is the text-only view the voice loop uses. Closing the iterator
early (``aclose()``, ``async with contextlib.aclosing(...)`` or cancelling the consuming task) stops generation
upstream: the embedded callback answers "stop" on the next chunk (llama.cpp then cancels the slot's task), the
HTTP backend drops the connection (servers abort on disconnect). A stream that is merely abandoned is only closed
when the garbage collector finalises it, so prefer ``aclosing``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from models.registry import Registry


@dataclass
class ChatMessage:
    role: Literal["system", "user", "assistant"]
    content: str


@dataclass
class LlmRequest:
    messages: list[ChatMessage]
    max_tokens: int = 128
    temperature: float = 0.0
    model: str | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    logprobs: bool = False  # ask for each token's log-probability (TokenChunk.logprob)
    # llama.cpp's repetition penalty (1 or None: off). Only the embedded backend sends it: it is no OpenAI
    # parameter, and an upstream may refuse unknown ones.
    repeat_penalty: float | None = None
    # Not sent upstream: lets a router keep one conversation on the upstream that holds its KV cache.
    conversation_id: str | None = None


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of prompt_tokens, those read from the backend's prompt cache (0: none, or not said)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class TokenChunk:
    """One step of a generation: usually one token's text; the last chunks carry finish_reason and usage."""

    text: str = ""
    logprob: float | None = None  # summed over the tokens in ``text`` when the backend reports them
    finish_reason: str | None = None  # "stop" | "length" | ...
    usage: Usage | None = None


class LlmUnavailable(Exception):
    """The backend is down, refused the connection, timed out or failed (HTTP 5xx)."""


class LlmRequestError(ValueError):
    """The backend rejected the request itself (HTTP 4xx, e.g. the prompt exceeds the context window)."""


@runtime_checkable
class LanguageModel(Protocol):
    name: str
    context_window: int

    def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]: ...

    def stream(self, request: LlmRequest) -> AsyncIterator[str]: ...

    def count_tokens(self, messages: list[ChatMessage]) -> int: ...

    async def close(self) -> None: ...


class TextStream:
    """Base of the backends: ``stream`` as the text-only view of ``generate`` (closing it closes the
    generation)."""

    # True: the model runs in this process and keeps the KV cache of the prompt it read last, so reading a prompt
    # ahead (the voice loop's warm-up) costs only local work and the next request that shares its start is faster.
    local_prompt_cache = False
    # True: a request whose last message is the assistant's has the model go on from that text (llama.cpp's
    # assistant prefill), streaming only what follows it; the voice loop then gives a reply's first word
    # (pipelines.voice.grounding). An OpenAI-compatible upstream may not (vLLM needs continue_final_message).
    continues_final_message = False

    def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        raise NotImplementedError

    async def stream(self, request: LlmRequest) -> AsyncIterator[str]:
        async with contextlib.aclosing(self.generate(request)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    yield chunk.text


# Every backend's config has ``model``: the model name clients ask for. One flat section before the split: a key
# of the other backend (e.g. api_key with the embedded LLM) is ignored with a warning, so old configs still load.
LANGUAGE_MODELS: Registry[LanguageModel] = Registry("llm", default="embedded", ignore_other_backends_keys=True)

LANGUAGE_MODELS.discover(sys.modules[__name__])  # each module registers itself on import
