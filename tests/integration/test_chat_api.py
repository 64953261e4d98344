"""The OpenAI-compatible chat API, driven by the official ``openai`` SDK against a real Vigil server with the
embedded SmolLM2 (and, for PII the small model will not produce, ``ScriptedLlmForTest`` at the chat API's
test seam). Redis mode runs a real ``redis-server`` and two ``vigil serve`` processes on loopback.

Cancellation is checked on what llama.cpp reports (tokens predicted, requests in flight), not on wall time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from models.llm.embedded import EmbeddedLlm
from server.v1.chat_service import CHAT_SERVICE
from tests.support.llm_server import LlmServer, wait_idle
from tests.support.ports import free_port
from tests.support.redis_server import RedisServer
from tests.support.scripted_llm import ScriptedLlmForTest
from tests.support.vigil_process import VigilProcess

MODEL = "smollm2-135m-instruct"
KEY = "sk-test-key"
FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
STORY = [{"role": "user", "content": "Write a long story about a dragon."}]
NO_CACHE = {"cache": {"exact": False, "semantic": False}}
KEYS = {"keys": [{"name": "tester", "key": KEY}]}
STAGES = ("ingress", "cache", "prompt", "llm", "filter")


def client_for(server: Any, key: str = KEY, **options: Any) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, **options)


def embedded_llm(server: Any) -> EmbeddedLlm:
    pipeline = server.app[CHAT_SERVICE].pipeline_if_loaded
    assert pipeline is not None and isinstance(pipeline.llm, EmbeddedLlm)
    return pipeline.llm


async def metric(server: Any, line_prefix: str) -> float:
    async with aiohttp.ClientSession() as session, session.get(server.url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_completion_streaming_and_usage(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE})
    client = client_for(server)
    raw = await client.chat.completions.with_raw_response.create(model=MODEL, messages=FRANCE, max_tokens=24,
                                                                 temperature=0)
    completion = raw.parse()
    answer = completion.choices[0].message.content
    assert answer and answer.strip()
    assert completion.choices[0].finish_reason in ("stop", "length")
    usage = completion.usage
    assert usage is not None and 0 < usage.completion_tokens <= 24
    assert usage.prompt_tokens == embedded_llm(server).count_tokens(_as_messages(FRANCE))
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert raw.headers["x-vigil-cache"] == "bypass"  # caches off
    timings = dict(part.split("=") for part in raw.headers["x-vigil-stage-timings"].split(";"))
    assert set(STAGES) <= set(timings) and all(float(ms) >= 0 for ms in timings.values())
    assert completion.model_extra["vigil"]["stage_timings_ms"].keys() >= set(STAGES)

    stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=24, temperature=0,
                                                  stream=True, stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(deltas) > 1  # streamed token by token, not in one piece
    assert "".join(deltas) == answer  # temperature 0: the same answer
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [completion.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == usage.prompt_tokens

    plain = await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=4, stream=True)
    assert all(c.usage is None for c in [c async for c in plain])  # usage only when asked for
    models = await client.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await client.models.retrieve(MODEL)).id == MODEL
    await client.close()


def _as_messages(messages: list[dict[str, str]]) -> list[Any]:
    from models.llm import ChatMessage

    return [ChatMessage(m["role"], m["content"]) for m in messages]  # type: ignore[arg-type]


async def test_disconnect_cancels_generation(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE})
    client = client_for(server)
    await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=1)  # loads the model
    llm = embedded_llm(server)
    disconnected = 'vigil_api_chat_requests_total{outcome="disconnected"}'
    before, disconnects = await wait_idle(llm.backend_metrics), await metric(server, disconnected)

    stream = await client.chat.completions.create(model=MODEL, messages=STORY, max_tokens=300, temperature=0,
                                                  stream=True)
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            assert (await asyncio.to_thread(llm.backend_metrics))["requests_processing"] == 1
            break
    await stream.close()  # drops the connection
    after = await wait_idle(llm.backend_metrics)
    assert after["requests_processing"] == 0
    assert 1 <= after["tokens_predicted_total"] - before["tokens_predicted_total"] < 40
    assert await metric(server, disconnected) == disconnects + 1

    # Non-streaming: the client gives up waiting and closes the connection.
    impatient = client_for(server, timeout=0.5)
    with pytest.raises(openai.APITimeoutError):
        await impatient.chat.completions.create(model=MODEL, messages=STORY, max_tokens=300, temperature=0)
    final = await wait_idle(llm.backend_metrics)
    assert final["tokens_predicted_total"] - after["tokens_predicted_total"] < 150
    assert await metric(server, disconnected) == disconnects + 2
    await client.close()
    await impatient.close()


async def test_api_keys(vigil) -> None:
    server = await vigil(api={"keys": [{"name": "a", "key": "key-a"}, {"name": "b", "key": "key-b"}]},
                         auth={"token": "dashboard-token"})
    async with aiohttp.ClientSession() as session, session.get(server.url + "/v1/models") as response:
        assert response.status == 401  # no key at all (the SDK refuses to send none)
        error_body = (await response.json())["error"]
        assert error_body["code"] == "invalid_api_key" and error_body["type"] == "authentication_error"
    for wrong in ("nope", "dashboard-token"):  # with API keys configured the dashboard token is no key
        client = client_for(server, key=wrong)
        with pytest.raises(openai.AuthenticationError) as error:
            await client.models.list()
        assert error.value.status_code == 401 and error.value.code == "invalid_api_key"
        await client.close()
    for good in ("key-a", "key-b"):
        client = client_for(server, key=good)
        assert (await client.models.list()).data
        await client.close()

    fallback = await vigil(auth={"token": "dashboard-token"})  # no API keys: auth.token guards /v1 too
    client = client_for(fallback, key="dashboard-token")
    assert (await client.models.list()).data
    with pytest.raises(openai.AuthenticationError):
        await client_for(fallback, key="other").models.list()
    await client.close()


async def test_rate_limit_answers_429_with_retry_after(vigil) -> None:
    server = await vigil(api={"keys": [{"name": "slow", "key": "key-slow", "rate_limit": {"requests": 2,
                                                                                          "window_s": 30}},
                                       {"name": "other", "key": "key-other"}]})
    slow = client_for(server, key="key-slow")
    await slow.models.list()
    await slow.models.list()
    with pytest.raises(openai.RateLimitError) as error:
        await slow.models.list()
    assert error.value.status_code == 429
    assert 1 <= int(error.value.response.headers["retry-after"]) <= 30
    with pytest.raises(openai.RateLimitError):  # refusals are not counted, but the window still holds two
        await slow.chat.completions.create(model=MODEL, messages=FRANCE)
    other = client_for(server, key="key-other")  # another key has its own window
    assert (await other.models.list()).data
    assert await metric(server, 'vigil_api_rate_limited_total{key="slow"}') >= 2
    await slow.close()
    await other.close()


async def test_models_are_the_union_of_the_routers_upstreams(vigil) -> None:
    # Nothing listens on these upstreams: /v1/models answers from the configuration alone.
    down = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    server = await vigil(api={**KEYS, **NO_CACHE, "served_models": ["house-alias"]}, models={"llm": {
        "backend": "openai", "upstreams": [{"name": "a", "base_url": down[0], "models": ["llama-8b", "qwen-7b"]},
                                           {"name": "b", "base_url": down[1], "models": ["qwen-7b", "mistral-7b"]}],
        "routing": {"health_timeout_s": 1}}})
    client = client_for(server)
    served = ["house-alias", "llama-8b", "qwen-7b", "mistral-7b"]
    assert [m.id for m in (await client.models.list()).data] == served
    assert (await client.models.retrieve("mistral-7b")).id == "mistral-7b"
    with pytest.raises(openai.NotFoundError) as error:
        await client.models.retrieve(MODEL)  # the default model name is not served by any upstream
    assert error.value.code == "model_not_found"
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as error:
            await client.chat.completions.create(model="gpt-4o", messages=FRANCE, max_tokens=4, stream=stream)
        body = error.value.body
        assert error.value.status_code == 404 and isinstance(body, dict)
        assert body["code"] == "model_not_found" and body["param"] == "model" and "mistral-7b" in body["message"]
    # A served model passes validation and reaches the router, whose upstreams are down: a clear 503.
    with pytest.raises(openai.InternalServerError) as unavailable:
        await client.chat.completions.create(model="llama-8b", messages=FRANCE, max_tokens=4)
    assert unavailable.value.status_code == 503 and unavailable.value.code == "model_unavailable"
    await client.close()

    embedded = await vigil(api={**KEYS, **NO_CACHE, "served_models": ["smol", MODEL]})
    client = client_for(embedded)
    assert [m.id for m in (await client.models.list()).data] == ["smol", MODEL]  # served_models replaces the name
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(model="gpt-4o", messages=FRANCE, max_tokens=4)
    await client.close()


async def test_models_discovered_from_an_upstream_configured_without_them(vigil) -> None:
    with LlmServer() as upstream:
        listed = [m["id"] for m in (await asyncio.to_thread(upstream.get_json, "/v1/models"))["data"]]
        server = await vigil(api={**KEYS, **NO_CACHE}, models={"llm": {
            "backend": "openai", "upstreams": [{"name": "llama", "base_url": upstream.url}]}})
        client = client_for(server)
        assert listed and [m.id for m in (await client.models.list()).data] == listed
        completion = await client.chat.completions.create(model=listed[0], messages=FRANCE, max_tokens=4)
        assert completion.choices[0].message.content
        with pytest.raises(openai.NotFoundError):  # the default name is not what this upstream serves
            await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=4)
        await client.close()


LONG_TEXT = "Tell me everything about the history of every country in the world, in detail. " * 200
VALIDATION_CASES = [
    ("role", {"messages": [{"role": "robot", "content": "hi"}]}, "messages[0].role"),
    ("empty content", {"messages": [{"role": "user", "content": "   "}]}, "messages[0].content"),
    ("no messages", {"messages": []}, "messages"),
    ("only system", {"messages": [{"role": "system", "content": "Be brief."}]}, "messages"),
    ("too many messages", {"messages": FRANCE * 9}, "messages"),
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens too large", {"max_tokens": 5000}, "max_tokens"),
    ("max_tokens not a number", {"max_tokens": "many"}, "max_tokens"),
    ("temperature", {"temperature": 2.5}, "temperature"),
    ("top_p", {"top_p": 0}, "top_p"),
    ("n", {"n": 2}, "n"),
    ("tools", {"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ("too many documents", {"extra_body": {"context_documents": ["doc"] * 5}}, "context_documents"),
    ("last message cannot fit", {"messages": [{"role": "user", "content": LONG_TEXT}], "max_tokens": 512},
     "messages"),
]


@pytest.mark.parametrize(("rule", "change", "param"), VALIDATION_CASES, ids=[c[0] for c in VALIDATION_CASES])
async def test_validation_answers_400(vigil, rule: str, change: dict[str, Any], param: str) -> None:
    server = await vigil(api={**KEYS, "max_messages": 8, "max_output_tokens": 1024,
                              "prompt": {"max_context_documents": 4}, **NO_CACHE})
    client = client_for(server)
    with pytest.raises(openai.BadRequestError) as error:
        await client.chat.completions.create(**{"model": MODEL, "messages": FRANCE, "max_tokens": 8, **change})
    assert error.value.status_code == 400
    body = error.value.body
    assert isinstance(body, dict) and body["param"] == param and body["message"]
    if rule == "last message cannot fit":
        assert body["code"] == "context_length_exceeded" and "2048" in body["message"]
    # the server is fine afterwards
    assert (await client.models.list()).data
    await client.close()


async def test_exact_cache_hit_on_repeated_deterministic_request(vigil) -> None:
    server = await vigil(api={**KEYS, "cache": {"semantic": False}})
    client = client_for(server)
    ask = {"model": MODEL, "messages": FRANCE, "max_tokens": 16, "temperature": 0}
    first = await client.chat.completions.with_raw_response.create(**ask)
    assert first.headers["x-vigil-cache"] == "miss"
    llm = embedded_llm(server)
    predicted = (await wait_idle(llm.backend_metrics))["tokens_predicted_total"]
    exact_hits = await metric(server, 'vigil_api_cache_total{result="exact"}')
    second = await client.chat.completions.with_raw_response.create(**ask)
    assert second.headers["x-vigil-cache"] == "exact"
    assert second.parse().model_extra["vigil"]["cache"] == "exact"
    assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
    assert second.parse().usage == first.parse().usage
    stream = await client.chat.completions.create(**ask, stream=True)  # a stream is served from it too
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == (
        first.parse().choices[0].message.content)
    assert (await wait_idle(llm.backend_metrics))["tokens_predicted_total"] == predicted  # nothing was generated
    assert await metric(server, 'vigil_api_cache_total{result="exact"}') == exact_hits + 2

    other = await client.chat.completions.with_raw_response.create(**{**ask, "max_tokens": 15})
    assert other.headers["x-vigil-cache"] == "miss"  # other parameters, other entry
    sampled = await client.chat.completions.with_raw_response.create(**{**ask, "temperature": 0.8})
    assert sampled.headers["x-vigil-cache"] == "bypass"  # never cache sampling unless configured
    again = await client.chat.completions.with_raw_response.create(**{**ask, "temperature": 0.8})
    assert again.headers["x-vigil-cache"] == "bypass"
    await client.close()


async def test_semantic_cache_hits_a_paraphrase_and_misses_an_unrelated_question(vigil) -> None:
    server = await vigil(api={**KEYS, "cache": {"exact": False, "semantic": True, "semantic_threshold": 0.9}})
    client = client_for(server)

    async def ask(question: str) -> tuple[str, Any]:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=16, temperature=0)
        return raw.headers["x-vigil-cache"], raw.parse()

    cache, original = await ask("What is the capital of France?")
    assert cache == "miss"
    llm = embedded_llm(server)
    before = await wait_idle(llm.backend_metrics)
    cache, paraphrase = await ask("What's France's capital?")
    assert cache == "semantic"
    # The generation started speculatively beside the embedding lookup was dropped, not left running.
    after = await wait_idle(llm.backend_metrics)
    assert after["requests_processing"] == 0
    assert after["tokens_predicted_total"] - before["tokens_predicted_total"] < 16
    assert paraphrase.choices[0].message.content == original.choices[0].message.content
    assert 0.9 <= paraphrase.model_extra["vigil"]["similarity"] <= 1.0
    cache, unrelated = await ask("How do I bake sourdough bread?")
    assert cache == "miss"
    assert unrelated.choices[0].message.content != original.choices[0].message.content
    await client.close()


PII_SCRIPT = ["Call me at 010-12", "34-5678 or write to bo", "b@exam", "ple.com. My number is 900101-1",
              "234567, thanks!"]
PII_MASKED = "Call me at [PHONE] or write to [EMAIL]. My number is [RRN], thanks!"


async def test_pii_is_masked_across_chunk_boundaries(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE})
    scripted = ScriptedLlmForTest(PII_SCRIPT, name=MODEL)
    server.app[CHAT_SERVICE].use_llm_for_test(scripted)
    client = client_for(server)
    stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, stream=True)
    deltas = [c.choices[0].delta.content async for c in stream if c.choices and c.choices[0].delta.content]
    assert "".join(deltas) == PII_MASKED
    assert len(deltas) > 2  # still streamed, only the uncertain tail was held back
    for secret in ("010", "1234", "5678", "bob", "example", "900101", "234567"):
        assert not any(secret in delta for delta in deltas), secret
    whole = await client.chat.completions.create(model=MODEL, messages=FRANCE)
    assert whole.choices[0].message.content == PII_MASKED
    assert await metric(server, 'vigil_api_content_filter_total{action="masked_phone"}') >= 2
    await client.close()


def _check_token_logprobs(entries: list[Any], text: str) -> None:
    assert entries and "".join(e.token for e in entries) == text
    for entry in entries:
        assert entry.logprob <= 0 and entry.top_logprobs == []
        assert bytes(entry.bytes) == entry.token.encode()


async def test_logprobs_stream_and_non_stream(vigil) -> None:
    server = await vigil(api={**KEYS, "cache": {"exact": True, "semantic": False}})
    client = client_for(server)
    ask = {"model": MODEL, "messages": FRANCE, "max_tokens": 12, "temperature": 0, "logprobs": True}
    raw = await client.chat.completions.with_raw_response.create(**ask)
    completion = raw.parse()
    assert raw.headers["x-vigil-cache"] == "bypass"  # logprob requests never enter or use the caches
    whole = completion.choices[0].logprobs.content
    _check_token_logprobs(whole, completion.choices[0].message.content)
    # One entry per generated token; llama.cpp also counts the end-of-turn token of an answer that stopped.
    stopped = completion.choices[0].finish_reason == "stop"
    assert len(whole) == completion.usage.completion_tokens - stopped
    assert any(entry.logprob < 0 for entry in whole)
    again = await client.chat.completions.with_raw_response.create(**ask)
    assert again.headers["x-vigil-cache"] == "bypass"

    stream = await client.chat.completions.create(**ask, stream=True)
    chunks = [c async for c in stream]
    streamed = [entry for c in chunks if c.choices and c.choices[0].logprobs for entry in c.choices[0].logprobs.content]
    for c in chunks:  # each chunk's entries are the tokens of its own delta
        if c.choices and c.choices[0].delta.content:
            assert "".join(e.token for e in c.choices[0].logprobs.content) == c.choices[0].delta.content
    assert [e.token for e in streamed] == [e.token for e in whole]  # temperature 0: the same tokens
    # Not bit-identical: the second request reuses the cached prompt, decoded in other batches (Qwen2.5-0.5B: 4e-3).
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in whole], abs=2e-2)

    plain = await client.chat.completions.create(**{**ask, "logprobs": False})
    assert plain.choices[0].logprobs is None
    for change, code in (({"top_logprobs": 2}, "unsupported_parameter"), ({"logprobs": False, "top_logprobs": 0},
                                                                          None)):
        with pytest.raises(openai.BadRequestError) as error:
            await client.chat.completions.create(**{**ask, **change})
        assert error.value.body["param"] == "top_logprobs" and error.value.code == code
    assert (await client.chat.completions.create(**ask, top_logprobs=0)).choices[0].logprobs.content
    await client.close()


async def test_logprobs_never_echo_masked_pii(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE})
    server.app[CHAT_SERVICE].use_llm_for_test(ScriptedLlmForTest(PII_SCRIPT, name=MODEL, logprob=-0.5))
    client = client_for(server)
    stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, stream=True, logprobs=True)
    chunks = [c async for c in stream if c.choices and c.choices[0].delta.content]
    entries = [entry for c in chunks for entry in c.choices[0].logprobs.content]
    _check_token_logprobs(entries, PII_MASKED)
    for secret in ("010", "5678", "bob", "example", "900101", "234567"):
        assert not any(secret in entry.token for entry in entries), secret
    assert sum(entry.logprob for entry in entries) == pytest.approx(-0.5 * len(PII_SCRIPT))  # every token counted
    whole = await client.chat.completions.create(model=MODEL, messages=FRANCE, logprobs=True)
    _check_token_logprobs(whole.choices[0].logprobs.content, PII_MASKED)
    await client.close()


async def test_blocked_pattern_ends_the_answer(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE, "content_filter": {"block_patterns": [r"(?i)launch codes?"]}})
    scripted = ScriptedLlmForTest(["Sure. The laun", "ch code is 0000", " and more text", " after it."], name=MODEL)
    server.app[CHAT_SERVICE].use_llm_for_test(scripted)
    client = client_for(server)
    stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, stream=True)
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Sure. The "
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "content_filter"]
    assert scripted.closed_early == 1  # generation stopped, not drained
    await client.close()


async def test_generations_in_flight_are_bounded(vigil) -> None:
    server = await vigil(api={**KEYS, **NO_CACHE, "max_in_flight": 1})
    release = asyncio.Event()
    scripted = ScriptedLlmForTest(["One", " answer."], name=MODEL, hold=release)
    server.app[CHAT_SERVICE].use_llm_for_test(scripted)
    client = client_for(server)
    first = asyncio.create_task(client.chat.completions.create(model=MODEL, messages=FRANCE))
    await scripted.started.wait()
    assert server.app[CHAT_SERVICE].in_flight == 1
    with pytest.raises(openai.InternalServerError) as error:
        await client.chat.completions.create(model=MODEL, messages=FRANCE, stream=True)
    assert error.value.status_code == 503 and error.value.code == "server_busy"
    assert int(error.value.response.headers["retry-after"]) >= 1
    release.set()
    assert (await first).choices[0].message.content == "One answer."
    assert server.app[CHAT_SERVICE].in_flight == 0
    await client.close()


async def test_long_conversation_is_fitted_to_the_context_window(vigil) -> None:
    # A large max_tokens leaves a small prompt budget (2048 - 1900), so the model only reads a short prompt; the
    # stop sequences keep the answer short.
    server = await vigil(api={**KEYS, **NO_CACHE, "max_output_tokens": 2000, "prompt": {
        "system_template": "You are terse.{% for doc in documents %}\nDocument: {{ doc }}{% endfor %}"}})
    client = client_for(server)
    history: list[dict[str, str]] = []
    for turn in range(4):
        history.append({"role": "user", "content": f"Question {turn}: " + "tell me about the weather. " * 20})
        history.append({"role": "assistant", "content": "It is sunny and warm today. " * 20})
    history.append({"role": "user", "content": "And tomorrow?"})
    documents = ["Tomorrow will be rainy.", "word " * 1500]  # the second cannot fit
    completion = await client.chat.completions.create(model=MODEL, messages=history, max_tokens=1900,
                                                      stop=[".", "\n"], extra_body={"context_documents": documents})
    prompt = completion.model_extra["vigil"]["prompt"]
    assert prompt["dropped_messages"] == 8 and prompt["dropped_documents"] == 1
    assert prompt["tokens"] <= 2048 - 1900
    assert completion.usage is not None and completion.usage.prompt_tokens == prompt["tokens"]
    await client.close()


async def test_openai_compatible_upstream_and_one_that_is_down(vigil) -> None:
    with LlmServer() as upstream:
        server = await vigil(api={**KEYS, **NO_CACHE},
                             models={"llm": {"backend": "openai", "base_url": upstream.url}})
        client = client_for(server)
        completion = await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0)
        assert completion.choices[0].message.content and completion.usage is not None
        stream = await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, temperature=0,
                                                      stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert text == completion.choices[0].message.content
        upstream.stop()  # the backend goes down: a clear 503 (the stream's status waits for its first token)
        for stream_it in (False, True):
            with pytest.raises(openai.InternalServerError) as error:
                await client.chat.completions.create(model=MODEL, messages=FRANCE, max_tokens=12, stream=stream_it)
            assert error.value.status_code == 503 and error.value.code == "model_unavailable"
        await client.close()


# ---------------------------------------------------------------- Redis: several processes share state


async def test_redis_mode_processes_share_rate_limit_and_cache(redis_server: RedisServer, tmp_path: Path) -> None:
    config = {
        "server": {"host": "127.0.0.1"},
        "models": {"detector": {"backend": "none"}},
        "voice": {"enabled": False},
        "redis": {"url": redis_server.url, "key_prefix": f"vigil-test-{tmp_path.name}:"},
        "api": {"keys": [{"name": "team", "key": "key-team", "rate_limit": {"requests": 3, "window_s": 60}},
                         {"name": "cache", "key": "key-cache"}],
                "cache": {"semantic": False}},
    }
    servers = [VigilProcess(tmp_path, config) for _ in range(2)]
    try:
        for server in servers:
            await asyncio.to_thread(server.start, 120)
        url_a, url_b = (server.url for server in servers)
        team_a = openai.AsyncOpenAI(base_url=url_a + "/v1", api_key="key-team", max_retries=0)
        team_b = openai.AsyncOpenAI(base_url=url_b + "/v1", api_key="key-team", max_retries=0)
        await team_a.models.list()
        await team_b.models.list()
        await team_a.models.list()
        for client in (team_b, team_a):  # the fourth request is refused by whichever process gets it
            with pytest.raises(openai.RateLimitError) as error:
                await client.models.list()
            assert 1 <= int(error.value.response.headers["retry-after"]) <= 60

        cache_a = openai.AsyncOpenAI(base_url=url_a + "/v1", api_key="key-cache", max_retries=0)
        cache_b = openai.AsyncOpenAI(base_url=url_b + "/v1", api_key="key-cache", max_retries=0)
        ask = {"model": MODEL, "messages": FRANCE, "max_tokens": 12, "temperature": 0}
        first = await cache_a.chat.completions.with_raw_response.create(**ask)
        assert first.headers["x-vigil-cache"] == "miss"
        second = await cache_b.chat.completions.with_raw_response.create(**ask)
        assert second.headers["x-vigil-cache"] == "exact"  # answered by B from what A stored
        assert second.parse().choices[0].message.content == first.parse().choices[0].message.content
        for client in (team_a, team_b, cache_a, cache_b):
            await client.close()
    finally:
        for server in servers:
            server.stop(20)


async def test_redis_unreachable_rate_limiter_refuses_and_caches_are_skipped(vigil) -> None:
    closed = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    limited = await vigil(api=KEYS, redis={"url": closed})
    client = client_for(limited)
    for _ in range(2):  # refused rather than let through unlimited, and again: nothing is left half-done
        with pytest.raises(openai.InternalServerError) as error:
            await client.models.list()
        assert error.value.status_code == 503 and error.value.code == "rate_limiter_unavailable"
        assert int(error.value.response.headers["retry-after"]) >= 1
    await client.close()

    # Without a rate limit the chat still answers; the Redis caches are skipped (a miss), never an error.
    unlimited = await vigil(api={**KEYS, "rate_limit": None, "cache": {"exact": True, "semantic": True}},
                            redis={"url": closed})
    client = client_for(unlimited)
    ask = {"model": MODEL, "messages": FRANCE, "max_tokens": 8, "temperature": 0}
    answers = []
    for stream in (False, False, True):
        raw = await client.chat.completions.with_raw_response.create(**ask, stream=stream)
        assert raw.headers["x-vigil-cache"] == "miss"
        parsed = raw.parse()
        answers.append(parsed.choices[0].message.content if not stream else "".join(
            [c.choices[0].delta.content or "" async for c in parsed if c.choices]))
    assert answers[0] and answers.count(answers[0]) == 3  # generated each time, alike at temperature 0
    await client.close()
