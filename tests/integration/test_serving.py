"""Units of the chat serving pipeline (``pipelines/serving``) on real parts: the served model's tokenizer
(SmolLM2 via xllamacpp), the packaged MiniLM embedder, a real ``redis-server`` on loopback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import redis.asyncio as aioredis
from hypothesis import given, settings
from hypothesis import strategies as st

from models.embeddings import MiniLmEmbedder, TextEmbedder
from models.llm import ChatMessage
from models.llm.embedded import EmbeddedLlm
from pipelines.serving.cache import (
    CachedCompletion,
    InProcessExactCache,
    InProcessSemanticCache,
    RedisExactCache,
    RedisSemanticCache,
)
from pipelines.serving.chat import LogprobTracker, TokenLogprob
from pipelines.serving.content_filter import StreamingContentFilter
from pipelines.serving.prompt import PromptBuilder, PromptTooLong
from pipelines.serving.ratelimit import InProcessRateLimiter, RedisRateLimiter
from pipelines.serving.telemetry import StageTimer
from server.config import DEFAULT_SYSTEM_TEMPLATE, ConfigError, load_settings
from tests.support.redis_server import RedisServer

ANSWER = CachedCompletion("Paris.", "stop", 30, 3)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def redis_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def embedder() -> TextEmbedder:
    return MiniLmEmbedder()


# ---------------------------------------------------------------- rate limits


async def test_in_process_sliding_window() -> None:
    clock = FakeClock()
    limiter = InProcessRateLimiter(clock=clock)
    for second in range(3):
        clock.now = 1000.0 + second
        decision = await limiter.hit("a", 3, 10.0)
        assert decision.allowed and decision.remaining == 2 - second
    clock.now = 1003.0
    refused = await limiter.hit("a", 3, 10.0)
    assert not refused.allowed and refused.retry_after_s == pytest.approx(7.0)
    assert (await limiter.hit("b", 3, 10.0)).allowed  # keys are independent
    clock.now = 1009.9  # still three in the window: refusals were not recorded
    assert not (await limiter.hit("a", 3, 10.0)).allowed
    clock.now = 1010.01  # the first request left the window: one slot, not three (sliding, not fixed)
    assert (await limiter.hit("a", 3, 10.0)).allowed
    assert not (await limiter.hit("a", 3, 10.0)).allowed


async def test_in_process_limiter_tracks_a_bounded_number_of_keys() -> None:
    limiter = InProcessRateLimiter(max_keys=100)
    for key in range(1000):
        await limiter.hit(f"ip:{key}", 1, 60.0)
    assert len(limiter._windows) == 100


async def test_redis_sliding_window(redis_client: aioredis.Redis) -> None:
    first, second = RedisRateLimiter(redis_client, "t1:"), RedisRateLimiter(redis_client, "t1:")  # two "processes"
    assert (await first.hit("k", 2, 30.0)).allowed
    assert (await second.hit("k", 2, 30.0)).allowed
    refused = await first.hit("k", 2, 30.0)
    assert not refused.allowed and 0 < refused.retry_after_s <= 30.0
    assert (await second.hit("other", 2, 30.0)).allowed
    assert (await RedisRateLimiter(redis_client, "t2:").hit("k", 2, 30.0)).allowed  # another prefix
    short = RedisRateLimiter(redis_client, "t3:")
    assert (await short.hit("k", 1, 0.2)).allowed
    assert not (await short.hit("k", 1, 0.2)).allowed
    await asyncio.sleep(0.25)  # the window slides past the first request
    assert (await short.hit("k", 1, 0.2)).allowed


# ---------------------------------------------------------------- content filter


def run_filter(content_filter: StreamingContentFilter, chunks: list[str]) -> tuple[list[str], bool]:
    out = []
    for chunk in chunks:
        result = content_filter.feed(chunk)
        out.append(result.text)
        if result.blocked:
            return out, True
    final = content_filter.finish()
    out.append(final.text)
    return out, final.blocked


@pytest.mark.parametrize(("text", "masked"), [
    ("mail bob.smith+x@mail.example.co.kr now", "mail [EMAIL] now"),
    ("call 010-1234-5678.", "call [PHONE]."),
    ("call +82 10 1234 5678 or (555) 123-4567", "call [PHONE] or [PHONE]"),
    ("call 01012345678", "call [PHONE]"),
    ("RRN 900101-1234567 and 001231-4234567", "RRN [RRN] and [RRN]"),
    ("not an RRN: 900101-5234567", "not an RRN: 900101-5234567"),
    ("in 2024 about 1234 people paid 12.50 on 2024-01-01", "in 2024 about 1234 people paid 12.50 on 2024-01-01"),
    ("user@localhost is no address", "user@localhost is no address"),
])
def test_pii_masks(text: str, masked: str) -> None:
    assert StreamingContentFilter().filter_all(text).text == masked


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_any_chunking_gives_the_same_masked_text(data: st.DataObject) -> None:
    text = data.draw(st.sampled_from([
        "Call me at 010-1234-5678 or write to bob@example.com, my RRN is 900101-1234567. Bye!",
        "Numbers: 02-123-4567; (555) 123-4567; +82 10 1234 5678; year 1999. Mail a.b@c.io",
    ]))
    cuts = sorted(data.draw(st.lists(st.integers(1, len(text) - 1), max_size=12, unique=True)))
    chunks = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    out, blocked = run_filter(StreamingContentFilter(), chunks)
    whole = StreamingContentFilter().filter_all(text).text
    assert not blocked and "".join(out) == whole
    assert "1234" not in "".join(out) and "@" not in "".join(out)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_logprobs_follow_the_filtered_text_in_whole_tokens(data: st.DataObject) -> None:
    text = "Call me at 010-1234-5678 or write to bob@example.com, my RRN is 900101-1234567. Bye now!"
    cuts = sorted(data.draw(st.lists(st.integers(1, len(text) - 1), max_size=30, unique=True)))
    tokens = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    content_filter, tracker = StreamingContentFilter(), LogprobTracker()
    sent: list[tuple[str, tuple[TokenLogprob, ...]]] = []
    for index, token in enumerate(tokens):
        tracker.add(token, -float(index + 1))
        released = content_filter.feed(token).text
        sent.append(tracker.release(released, content_filter.held_chars))
    sent.append(tracker.release(content_filter.finish().text, 0))
    assert "".join(out for out, _ in sent) == StreamingContentFilter().filter_all(text).text
    for out, entries in sent:  # each piece sent carries exactly the tokens it is made of
        assert "".join(entry.token for entry in entries) == out
    entries = [entry for _, piece in sent for entry in piece]
    assert sum(entry.logprob or 0 for entry in entries) == -sum(range(1, len(tokens) + 1))  # none lost
    assert not any(secret in entry.token for entry in entries for secret in ("1234", "bob", "900101"))


def test_text_is_held_back_only_while_it_may_become_pii() -> None:
    content_filter = StreamingContentFilter()
    assert content_filter.feed("Hello there, my number is 010-12").text == "Hello there, my number is "
    assert content_filter.feed("34-5678 ok").text == "[PHONE] "  # "ok" might start an e-mail address
    assert content_filter.feed(" fine").text == "ok "
    assert content_filter.finish().text == "fine"


def test_held_text_is_bounded() -> None:
    content_filter = StreamingContentFilter(max_hold_chars=32)
    out = content_filter.feed("x" * 100).text  # one long "word": could be an e-mail's local part
    assert out == "x" * 68
    assert content_filter.finish().text == "x" * 32


def test_blocked_pattern_across_chunks_is_never_sent() -> None:
    content_filter = StreamingContentFilter(block_patterns=[r"(?i)forbidden\s+word"])
    out, blocked = run_filter(content_filter, ["This is the forb", "idden ", "word and more"])
    assert blocked and "".join(out) == "This is the "
    assert content_filter.feed("more").blocked
    out, blocked = run_filter(StreamingContentFilter(block_patterns=[r"(?i)forbidden\s+word"]),
                              ["forbidden", " fruit"])
    assert not blocked and "".join(out) == "forbidden fruit"


def test_config_rejects_bad_patterns_and_templates() -> None:
    with pytest.raises(ConfigError, match="block_patterns"):
        load_settings(None, {"api": {"content_filter": {"block_patterns": ["(unclosed"]}}})
    with pytest.raises(ConfigError, match="system_template"):
        load_settings(None, {"api": {"prompt": {"system_template": "{{ broken"}}})


# ---------------------------------------------------------------- prompt


def user(text: str) -> ChatMessage:
    return ChatMessage("user", text)


def test_prompt_fits_in_one_count_when_everything_fits(embedded_llm: EmbeddedLlm) -> None:
    calls: list[int] = []

    def count(messages: list[ChatMessage]) -> int:
        calls.append(len(messages))
        return embedded_llm.count_tokens(messages)

    builder = PromptBuilder(DEFAULT_SYSTEM_TEMPLATE)
    messages = [ChatMessage("system", "Be brief."), user("Hi"), ChatMessage("assistant", "Hello!"), user("Why?")]
    fitted = builder.fit(model="m", messages=messages, documents=["Doc one."], count_tokens=count,
                         context_window=2048, reserve_output=64)
    assert len(calls) == 1
    assert fitted.messages[0].role == "system"
    assert "Be brief." in fitted.messages[0].content and "[1] Doc one." in fitted.messages[0].content
    assert [m.content for m in fitted.messages[1:]] == ["Hi", "Hello!", "Why?"]
    assert fitted.prompt_tokens == embedded_llm.count_tokens(fitted.messages)
    assert (fitted.dropped_messages, fitted.dropped_documents) == (0, 0)


def test_prompt_priority_system_then_recent_messages_then_documents(embedded_llm: EmbeddedLlm) -> None:
    builder = PromptBuilder("You are Vigil.{% if documents %} Docs: {{ documents | join(' | ') }}{% endif %}")
    filler = "words " * 60
    messages = []
    for turn in range(6):
        messages += [user(f"q{turn} {filler}"), ChatMessage("assistant", f"a{turn} {filler}")]
    messages.append(user("final question"))
    budget_window, reserve = 400, 100
    fitted = builder.fit(model="m", messages=messages, documents=["short doc", "long doc " + filler * 3],
                         count_tokens=embedded_llm.count_tokens, context_window=budget_window, reserve_output=reserve)
    assert fitted.prompt_tokens <= budget_window - reserve
    assert fitted.messages[0].content.startswith("You are Vigil.")
    assert fitted.messages[-1].content == "final question"
    assert fitted.messages[1].role == "user"  # the kept history starts at a user turn
    kept = fitted.messages[1:]
    assert kept == messages[len(messages) - len(kept):]  # the most recent ones, in order
    assert fitted.dropped_messages == len(messages) - len(kept) > 0
    assert fitted.dropped_documents == 1 and "short doc" in fitted.messages[0].content
    # one more message would not have fitted
    more = [fitted.messages[0], *messages[len(messages) - len(kept) - 2:]]
    assert embedded_llm.count_tokens(more) > budget_window - reserve


def test_prompt_that_cannot_fit_its_last_message(embedded_llm: EmbeddedLlm) -> None:
    builder = PromptBuilder(DEFAULT_SYSTEM_TEMPLATE)
    with pytest.raises(PromptTooLong, match="last message"):
        builder.fit(model="m", messages=[user("word " * 500)], documents=[], count_tokens=embedded_llm.count_tokens,
                    context_window=512, reserve_output=128)
    with pytest.raises(PromptTooLong, match="no room"):
        builder.fit(model="m", messages=[user("hi")], documents=[], count_tokens=embedded_llm.count_tokens,
                    context_window=512, reserve_output=512)


def test_per_model_templates_and_fingerprint() -> None:
    builder = PromptBuilder("default {{ system }}", {"special": "special for {{ model }}"})
    assert builder.system_text("m", "x", []) == "default x"
    assert builder.system_text("special", "x", []) == "special for special"
    assert builder.fingerprint != PromptBuilder("other {{ system }}").fingerprint


# ---------------------------------------------------------------- caches and embeddings


def test_embedder_gives_unit_vectors_close_for_paraphrases(embedder: TextEmbedder) -> None:
    vectors = embedder.embed(["What is the capital of France?", "What's France's capital?",
                              "How do I bake sourdough bread?"])
    assert vectors.shape == (3, embedder.dimension) == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
    assert vectors[0] @ vectors[1] > 0.9 > vectors[0] @ vectors[2]


async def test_in_process_exact_cache_ttl_and_bound() -> None:
    clock = FakeClock()
    cache = InProcessExactCache(ttl_s=10, max_entries=2, clock=clock)
    await cache.put("a", ANSWER)
    assert await cache.get("a") == ANSWER
    clock.now += 11
    assert await cache.get("a") is None
    for key in "abc":
        await cache.put(key, ANSWER)
    assert await cache.get("a") is None and await cache.get("c") == ANSWER


@pytest.mark.parametrize("store", ["in-process", "redis"])
async def test_semantic_cache(store: str, embedder: TextEmbedder, redis_server: RedisServer) -> None:
    client = aioredis.from_url(redis_server.url) if store == "redis" else None
    cache = (RedisSemanticCache(client, ttl_s=60, max_entries=4, key_prefix=f"sem-{id(client)}:") if client
             else InProcessSemanticCache(ttl_s=60, max_entries=4))
    question, paraphrase, unrelated = embedder.embed(
        ["What is the capital of France?", "Which city is the capital of France?", "How do I bake bread?"])
    assert await cache.get("scope", question, 0.9) is None
    await cache.put("scope", question, ANSWER)
    hit = await cache.get("scope", paraphrase, 0.9)
    assert hit is not None and hit[0] == ANSWER and 0.9 <= hit[1] <= 1.0
    assert await cache.get("scope", unrelated, 0.9) is None
    assert await cache.get("other scope", question, 0.9) is None  # another conversation or parameters
    for _ in range(4):  # bounded: the oldest entry goes first
        await cache.put("scope", unrelated, CachedCompletion("Bread.", "stop", 1, 1))
    assert await cache.get("scope", question, 0.9) is None
    if client is not None:
        await client.aclose()


async def test_redis_exact_cache_is_shared_and_expires(redis_client: aioredis.Redis) -> None:
    writer, reader = RedisExactCache(redis_client, ttl_s=0.3), RedisExactCache(redis_client, ttl_s=0.3)
    await writer.put("k", ANSWER)
    assert await reader.get("k") == ANSWER
    await asyncio.sleep(0.4)
    assert await reader.get("k") is None


def test_stage_timer_header() -> None:
    timer = StageTimer()
    timer.add("ingress", 0.25)
    with timer.stage("cache"):
        pass
    timer.add("filter", 1.0)
    timer.add("filter", 0.5)
    stages = dict(part.split("=") for part in timer.header().split(";"))
    assert list(stages) == ["ingress", "cache", "filter"] and float(stages["filter"]) == 1.5


def test_packaged_embeddings_model_is_found() -> None:
    from models.embeddings import minilm_dir

    assert isinstance(minilm_dir(), Path) and (minilm_dir() / "tokenizer.json").is_file()
