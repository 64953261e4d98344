"""LLM backends against the real SmolLM2 model: in-process (xllamacpp) and over HTTP (llama.cpp's server in
a child process, tests/support/llm_server.py). Network tests need loopback only (``unshare -n`` with lo up).

Cancellation is checked on what llama.cpp reports (tokens predicted, requests in flight), not on wall time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from models.llm import ChatMessage, LanguageModel, LlmRequest, LlmRequestError, LlmUnavailable, Usage
from models.llm.embedded import EmbeddedLlm, packaged_llm_path
from models.llm.openai_chat import OpenAiLlm
from tests.support.llm_server import LlmServer, wait_idle

FRANCE = [ChatMessage("user", "What is the capital of France?")]
LONG_ANSWER = [ChatMessage("user", "Write a long story about a dragon.")]
MAX_TOKENS_LONG = 200  # far more than a prompt cancellation may let through


@pytest.fixture(scope="module")
def http_server() -> Iterator[LlmServer]:
    with LlmServer() as server:
        yield server


async def collect(llm: LanguageModel, request: LlmRequest) -> list[str]:
    async with contextlib.aclosing(llm.stream(request)) as deltas:
        return [delta async for delta in deltas]


async def test_embedded_streams_a_deterministic_answer_incrementally(embedded_llm: EmbeddedLlm) -> None:
    assert isinstance(embedded_llm, LanguageModel)
    request = LlmRequest(FRANCE, max_tokens=48)
    first: list[str] = []
    async with contextlib.aclosing(embedded_llm.stream(request)) as deltas:
        async for delta in deltas:
            if not first:  # the answer is still being generated when its first piece arrives
                assert (await asyncio.to_thread(embedded_llm.backend_metrics))["requests_processing"] == 1
            first.append(delta)
    second = await collect(embedded_llm, request)
    assert len(first) > 1
    assert "".join(first).strip()
    assert first == second


@pytest.mark.parametrize("how", ["aclose", "cancel_task"])
async def test_embedded_cancellation_stops_generation(embedded_llm: EmbeddedLlm, how: str) -> None:
    before = await wait_idle(embedded_llm.backend_metrics)
    request = LlmRequest(LONG_ANSWER, max_tokens=MAX_TOKENS_LONG)
    if how == "aclose":
        async with contextlib.aclosing(embedded_llm.stream(request)) as deltas:
            async for _ in deltas:
                break
    else:
        got_one = asyncio.Event()

        async def consume() -> None:
            async for _ in embedded_llm.stream(request):
                got_one.set()

        task = asyncio.create_task(consume())
        await got_one.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    after = await wait_idle(embedded_llm.backend_metrics)
    assert after["requests_processing"] == 0
    generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    assert 1 <= generated < 20, generated  # one token to see, a couple more while the cancel lands


async def test_embedded_serves_concurrent_sessions(embedded_llm: EmbeddedLlm) -> None:
    request = LlmRequest(FRANCE, max_tokens=16)
    alone = await collect(embedded_llm, request)
    together = await asyncio.gather(*(collect(embedded_llm, request) for _ in range(3)))
    assert all(answer == alone for answer in together)


async def test_count_tokens(embedded_llm: EmbeddedLlm, http_server: LlmServer) -> None:
    exact = embedded_llm.count_tokens(FRANCE)
    # Cross-check with llama.cpp's template + tokenizer endpoints on the separate server process.
    prompt = (await asyncio.to_thread(http_server.post_json, "/apply-template", {"messages": [vars(FRANCE[0])]}))[
        "prompt"
    ]
    tokens = (await asyncio.to_thread(http_server.post_json, "/tokenize", {"content": prompt}))["tokens"]
    assert exact == len(tokens)
    longer = [*FRANCE, ChatMessage("assistant", "Paris."), ChatMessage("user", "And of Spain?")]
    assert embedded_llm.count_tokens(longer) > exact
    # The HTTP backend only estimates (chars/4 + per-message overhead): close for ordinary prose, but it cannot
    # know template extras such as SmolLM2's hidden default system prompt (most of the 37 tokens above).
    prose = [ChatMessage("user", "The quick brown fox jumps over the lazy dog near the riverbank. " * 6)]
    approx = OpenAiLlm(http_server.url, http_server.model).count_tokens(prose)
    assert embedded_llm.count_tokens(prose) / 2 <= approx <= embedded_llm.count_tokens(prose) * 2


async def test_generate_reports_logprobs_finish_reason_and_usage(
    embedded_llm: EmbeddedLlm, http_server: LlmServer
) -> None:
    request = LlmRequest(FRANCE, max_tokens=6, logprobs=True)
    llm = OpenAiLlm(http_server.url, http_server.model, timeout=60)
    try:
        for backend in (embedded_llm, llm):
            async with contextlib.aclosing(backend.generate(request)) as generation:
                chunks = [chunk async for chunk in generation]
            tokens = [c for c in chunks if c.text]
            assert len(tokens) == 6  # max_tokens = 6 and the answer is longer
            assert all(c.logprob is not None and c.logprob <= 0 for c in tokens)
            assert [c.finish_reason for c in chunks if c.finish_reason] == ["length"]
            usage = next(c.usage for c in chunks if c.usage)
            assert usage.completion_tokens == 6
            assert usage.prompt_tokens == embedded_llm.count_tokens(FRANCE)
            # without logprobs asked for, none are reported
            async with contextlib.aclosing(backend.generate(LlmRequest(FRANCE, max_tokens=2))) as generation:
                assert all(c.logprob is None for c in [c async for c in generation])
    finally:
        await llm.close()


async def test_a_prompt_read_ahead_is_reused_from_the_kv_cache(embedded_llm: EmbeddedLlm) -> None:
    """The voice loop's warm-up: the prompt with the question so far, read for one token, leaves the KV cache
    holding it; the whole question's request then reads only what follows (usage.cached_tokens says so)."""
    system = ChatMessage("system", "You are a helpful voice assistant. Answer in one short sentence.")

    async def usage_of(question: str, max_tokens: int) -> Usage:
        request = LlmRequest([system, ChatMessage("user", question)], max_tokens=max_tokens)
        async with contextlib.aclosing(embedded_llm.generate(request)) as generation:
            return next(c.usage for c in [c async for c in generation] if c.usage)

    assert embedded_llm.local_prompt_cache
    await usage_of("Hello there.", 1)  # the cache holds the system prompt only
    cold = await usage_of("Which planet in our solar system is the closest to the sun?", 4)
    partial = [system, ChatMessage("user", "Which planet in our solar system is the closest")]
    await usage_of("Hello there.", 1)
    await usage_of(partial[1].content, 1)  # the warm-up
    warm = await usage_of("Which planet in our solar system is the closest to the sun?", 4)
    assert warm.prompt_tokens == cold.prompt_tokens
    # Everything up to the partial's last words came from the cache, the question's words included.
    assert cold.cached_tokens < warm.cached_tokens
    assert warm.cached_tokens >= embedded_llm.count_tokens(partial) - 6


async def test_http_stream_matches_embedded(embedded_llm: EmbeddedLlm, http_server: LlmServer) -> None:
    request = LlmRequest(FRANCE, max_tokens=32)
    llm = OpenAiLlm(http_server.url, http_server.model, timeout=60)
    try:
        remote = await collect(llm, request)
    finally:
        await llm.close()
    assert len(remote) > 1
    # Same GGUF, same llama.cpp settings, same chat template (the model's own): greedy decoding agrees.
    assert "".join(remote) == "".join(await collect(embedded_llm, request))


async def test_http_close_aborts_upstream_generation(http_server: LlmServer) -> None:
    llm = OpenAiLlm(http_server.url, http_server.model, timeout=60)
    try:
        before = await wait_idle(http_server.metrics)
        async with contextlib.aclosing(llm.stream(LlmRequest(LONG_ANSWER, max_tokens=MAX_TOKENS_LONG))) as deltas:
            async for _ in deltas:
                break
        after = await wait_idle(http_server.metrics)
        assert after["requests_processing"] == 0
        generated = after["tokens_predicted_total"] - before["tokens_predicted_total"]
        assert 1 <= generated < 20, generated
        slots = await asyncio.to_thread(http_server.get_json, "/slots")
        assert not any(slot["is_processing"] for slot in slots)
        assert await collect(llm, LlmRequest(FRANCE, max_tokens=4))  # the slot serves the next request
    finally:
        await llm.close()


async def test_backend_going_down_raises_llm_unavailable() -> None:
    server = await asyncio.to_thread(LlmServer().start)
    llm = OpenAiLlm(server.url, server.model, timeout=30)
    try:
        deltas = llm.stream(LlmRequest(LONG_ANSWER, max_tokens=MAX_TOKENS_LONG))
        await anext(deltas)
        await asyncio.to_thread(server.stop)  # killed mid-answer
        with pytest.raises(LlmUnavailable, match=r"127\.0\.0\.1"):
            async for _ in deltas:
                pass
        with pytest.raises(LlmUnavailable, match=r"http://127\.0\.0\.1:\d+/v1/chat/completions.*unavailable"):
            await collect(llm, LlmRequest(FRANCE))
    finally:
        await asyncio.to_thread(server.stop)
        await llm.close()


async def test_embedded_applies_the_models_chat_template(embedded_llm: EmbeddedLlm) -> None:
    # SmolLM2-135M (Q4_1) answers the bare "What is the capital of France?" with French trivia rather than
    # "Paris"; this phrasing gets a sensible answer, which a wrong or missing chat template would not.
    request = LlmRequest([ChatMessage("user", "Which city is the capital of France?")])
    answer = "".join(await collect(embedded_llm, request))
    assert "Paris" in answer


async def test_embedded_errors() -> None:
    llm = await EmbeddedLlm.open(n_ctx=512)
    assert await collect(llm, LlmRequest(FRANCE, max_tokens=2))
    with pytest.raises(LlmRequestError, match="context"):
        await collect(llm, LlmRequest([ChatMessage("user", "hello " * 1000)]))
    deltas = llm.stream(LlmRequest(LONG_ANSWER, max_tokens=MAX_TOKENS_LONG))
    await anext(deltas)
    await llm.close()  # while a stream is open: it ends with an error, not a silently truncated answer
    with pytest.raises(LlmUnavailable, match="closed"):
        async for _ in deltas:
            pass
    with pytest.raises(LlmUnavailable, match="closed"):
        await collect(llm, LlmRequest(FRANCE))
    with pytest.raises(LlmUnavailable, match="closed"):
        llm.count_tokens(FRANCE)


async def test_the_default_packaged_model_answers_through_its_chat_template() -> None:
    """The configured default (models.llm.weights, set up and hash-checked by scripts/setup.sh) loads and answers
    right with the voice loop's settings (its repetition penalty included)."""
    from models.llm.embedded import EmbeddedLlmConfig
    from models.packaged import DEFAULT_LLM

    assert EmbeddedLlmConfig().weights == DEFAULT_LLM
    llm = await EmbeddedLlm.open(str(packaged_llm_path(DEFAULT_LLM)))
    try:
        question = [ChatMessage("system", "Answer in one short sentence."),
                    ChatMessage("user", "What is the capital of France?")]
        answer = "".join(await collect(llm, LlmRequest(question, max_tokens=24, repeat_penalty=1.1)))
        assert "Paris" in answer, answer
    finally:
        await llm.close()


async def test_speculative_decoding_keeps_the_reply_and_counts_what_the_draft_proposed() -> None:
    """models.llm.speculative: a draft model proposes, the model keeps what it agrees with. Greedy decoding gives
    the same reply with or without it; the counters show the draft was really used. The default model drafts for
    itself here (the 1.5B it is meant for is set up on demand only), so nearly every proposal is kept."""
    from prometheus_client import REGISTRY

    from models.llm.embedded import SpeculativeDecodingConfig
    from models.packaged import DEFAULT_LLM

    def drafted(outcome: str) -> float:
        labels = {"model": Path(path).stem, "outcome": outcome}
        return REGISTRY.get_sample_value("vigil_llm_draft_tokens_total", labels) or 0.0

    path = str(packaged_llm_path(DEFAULT_LLM))
    request = LlmRequest([ChatMessage("user", "Count from one to twelve in words, separated by commas.")],
                         max_tokens=40)
    plain = await EmbeddedLlm.open(path, n_ctx=512)
    try:
        expected = "".join(await collect(plain, request))
    finally:
        await plain.close()
    before = drafted("accepted"), drafted("rejected")
    speculative = await EmbeddedLlm.open(
        path, n_ctx=512, speculative=SpeculativeDecodingConfig(method="draft", draft_model_path=path))
    try:
        assert "".join(await collect(speculative, request)) == expected
        metrics = await asyncio.to_thread(speculative.backend_metrics)
    finally:
        await speculative.close()
    kept, refused = drafted("accepted") - before[0], drafted("rejected") - before[1]
    assert metrics["spec_decode_num_draft_tokens_total"] == kept + refused > 0
    assert kept >= 0.8 * (kept + refused), (kept, refused)  # a model agrees with itself


def test_a_draft_of_another_tokenizer_is_refused_by_the_config() -> None:
    from pydantic import ValidationError

    from models.llm.embedded import EmbeddedLlmConfig

    with pytest.raises(ValidationError, match="same tokenizer"):
        EmbeddedLlmConfig(weights="qwen2.5-1.5b", speculative={"method": "draft", "draft_weights": "smollm2-135m"})
    assert EmbeddedLlmConfig(weights="qwen2.5-1.5b", speculative={"method": "draft"}).speculative.draft_weights == (
        "qwen2.5-0.5b")
