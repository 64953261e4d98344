"""The OpenAI chat-completions format and its HTTP client: the request body and the streamed chunks (both backends
speak it: llama.cpp's in-process server answers in it too), and ``OpenAiLlm``, one OpenAI-compatible endpoint
streamed with ``stream: true`` over aiohttp (the router's client of each upstream)."""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator
from typing import Any, Literal

import aiohttp

from models.llm import ChatMessage, LlmRequest, LlmRequestError, LlmUnavailable, TextStream, TokenChunk, Usage

# How an upstream goes on from a last assistant message (the voice loop's grounded first word): not at all (the
# message is taken as a finished turn), as vLLM does when asked (continue_final_message), or as llama.cpp's server
# does by itself (assistant prefill).
FinalMessage = Literal["no", "vllm", "llama.cpp"]


def request_body(request: LlmRequest, model: str | None, *, llama_cpp: bool = False,
                 final_message: FinalMessage = "no") -> dict[str, Any]:
    body: dict[str, Any] = {
        "messages": [{"role": m.role, "content": m.content} for m in request.messages],
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    optional = {"model": model, "top_p": request.top_p, "stop": request.stop, "seed": request.seed}
    body.update({key: value for key, value in optional.items() if value is not None})
    if request.logprobs:
        body["logprobs"] = True
    if llama_cpp and request.repeat_penalty is not None:
        body["repeat_penalty"] = request.repeat_penalty
    if final_message == "vllm" and request.messages and request.messages[-1].role == "assistant":
        body.update(continue_final_message=True, add_generation_prompt=False)  # vLLM refuses the two together
    return body


def parse_chunk(chunk: dict[str, Any], where: str) -> TokenChunk:
    """One OpenAI chat-completion chunk as a TokenChunk; raises on an error chunk."""
    if "error" in chunk:
        raise backend_error(where, chunk["error"])
    text, finish_reason, logprob = "", None, None
    for choice in chunk.get("choices") or ():
        text += (choice.get("delta") or {}).get("content") or ""
        finish_reason = finish_reason or choice.get("finish_reason")
        token_logprobs = [t.get("logprob") for t in ((choice.get("logprobs") or {}).get("content") or ())]
        if token_logprobs and None not in token_logprobs:
            logprob = (logprob or 0.0) + sum(token_logprobs)
    usage = None
    if isinstance(chunk.get("usage"), dict):
        counts = chunk["usage"]
        cached = (counts.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        usage = Usage(int(counts.get("prompt_tokens", 0)), int(counts.get("completion_tokens", 0)), int(cached))
    return TokenChunk(text, logprob, finish_reason, usage)


def backend_error(where: str, error: Any) -> Exception:
    """An error object (``{"code", "message"}``) as LlmRequestError (4xx) or LlmUnavailable (anything else)."""
    code = error.get("code", 500) if isinstance(error, dict) else 500
    message = error.get("message", error) if isinstance(error, dict) else error
    cls = LlmRequestError if isinstance(code, int) and 400 <= code < 500 else LlmUnavailable
    return cls(f"LLM backend {where} failed (code {code}): {message}")


class OpenAiLlm(TextStream):
    """An OpenAI-compatible chat endpoint, streamed with SSE.

    ``base_url`` may end in ``/v1`` or not. ``timeout`` bounds connecting and each wait for the next chunk
    (not the whole answer). ``count_tokens`` is an approximation (see there). Use one instance per event loop.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout: float = 30.0,
        context_window: int = 4096,
        final_message: FinalMessage = "no",
    ) -> None:
        base = base_url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.name = model
        self.model = model
        self.context_window = context_window
        self.final_message = final_message
        self.continues_final_message = final_message != "no"
        self._headers = {"Accept": "text/event-stream"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=timeout, sock_read=timeout)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            # No keep-alive: llama.cpp's server closes the connection after every streamed answer (measured: each
            # reuse fails with "Cannot write to closing transport"), so pooling would cost a failed attempt and a
            # retry per request against it; a new connection per request is cheaper there.
            connector = aiohttp.TCPConnector(force_close=True)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout, headers=self._headers)
        return self._session

    def _unavailable(self, exc: BaseException) -> LlmUnavailable:
        reason = str(exc) or type(exc).__name__
        return LlmUnavailable(f"LLM backend {self.url} is unavailable: {reason}")

    async def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        body = request_body(request, request.model or self.model, final_message=self.final_message)
        try:
            response = await self._client().post(self.url, json=body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise self._unavailable(exc) from exc
        finished = False
        try:
            if response.status >= 400:
                try:
                    detail = (await response.text())[:500]
                except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as exc:
                    detail = repr(exc)
                cls = LlmUnavailable if response.status >= 500 else LlmRequestError
                raise cls(f"LLM backend {self.url} answered HTTP {response.status}: {detail}")
            while True:
                try:
                    raw = await response.content.readline()
                except (aiohttp.ClientError, TimeoutError) as exc:
                    raise self._unavailable(exc) from exc
                if not raw:  # EOF: fine after a finish_reason, otherwise the server died mid-answer
                    if finished:
                        return
                    raise LlmUnavailable(f"LLM backend {self.url} closed the stream before finishing")
                line = raw.decode("utf-8").strip()
                field, _, data = line.partition(":")
                data = data.strip()
                if field == "data" and data == "[DONE]":
                    return
                if field not in ("data", "error") or not data:
                    continue  # blank separators, comments/pings, event names
                try:
                    chunk = json.loads(data)
                except ValueError as exc:
                    raise LlmUnavailable(f"LLM backend {self.url} sent a malformed chunk: {data[:200]}") from exc
                if field == "error" and "error" not in chunk:  # llama.cpp's "error: {...}" event
                    chunk = {"error": chunk}
                parsed = parse_chunk(chunk, self.url)
                finished = finished or parsed.finish_reason is not None
                if parsed.text or parsed.finish_reason or parsed.usage:
                    yield parsed
        finally:
            response.close()  # drops the connection: this is how vLLM / llama.cpp learn to abort generation

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        """Approximate: ceil(chars / 4) per message plus 4 tokens of template overhead each, plus 3 for the
        assistant prompt. The served tokenizer is not reachable through the plain OpenAI API. Close for English
        prose; blind to template extras (SmolLM2's template silently adds a ~20-token system prompt)."""
        return 3 + sum(4 + math.ceil(len(m.content) / 4) for m in messages)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
