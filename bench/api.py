"""Chat API benchmark: time to first token (TTFT) and time per output token (TPOT) at concurrency 1, 4 and 8
against the embedded backend (SmolLM2 on xllamacpp), through Vigil's /v1/chat/completions (streaming, the full
pipeline: API key, rate limiter, cache lookup with embeddings, prompt fitting, PII filter) and directly on the
same in-process backend object. The ratio of the two is the pipeline's overhead (goal <= 1.05).

Every request asks a different question at temperature 0 with a fixed max_tokens, so the cache always misses
(its lookup cost is still paid) and both paths generate the same tokens. Both run in this one process, in short
alternating rounds (direct then vigil, vigil then direct, ...), so machine drift hits both. Vigil's stream is read
with plain aiohttp by default; ``--client sdk`` reads it with the official openai SDK, whose per-chunk parsing
runs in this same process and, on a 2-core machine, competes with llama.cpp's threads (client cost, not pipeline
cost). On a small CPU-only machine the pipeline's own CPU work (embedding for the semantic cache, token counting,
SSE) also competes with llama.cpp's threads; ``--no-semantic-cache`` and ``--no-filter`` show their share.
Run it offline like the tests:  make bench BENCH=api  or
    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.api --max-tokens 32'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import aiohttp
import openai

from models.llm import ChatMessage, LanguageModel, LlmRequest
from server.app import create_app
from server.config import load_settings
from server.http.serve import start_serving
from server.v1.chat_service import CHAT_SERVICE

MODEL = "smollm2-135m-instruct"
KEY = "bench-key"
SUBJECTS = ["cats", "rivers", "the moon", "bicycles", "volcanoes", "tea", "chess", "bridges", "owls", "glaciers",
            "trains", "coral reefs", "violins", "deserts", "bees", "lighthouses", "maps", "comets", "bread", "wolves"]
TEMPLATES = ["Tell me one fact about {}.", "Why do people like {}?", "Describe {} in a sentence.",
             "What is special about {}?"]


@dataclass
class Sample:
    ttft_ms: float
    total_ms: float
    tokens: int

    @property
    def tpot_ms(self) -> float | None:
        return (self.total_ms - self.ttft_ms) / (self.tokens - 1) if self.tokens > 1 else None


def questions() -> itertools.cycle[str]:
    distinct = [template.format(subject) for template in TEMPLATES for subject in SUBJECTS]
    return itertools.cycle(distinct)


async def direct(llm: LanguageModel, question: str, max_tokens: int) -> Sample:
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    request = LlmRequest([ChatMessage("user", question)], max_tokens=max_tokens, temperature=0.0)
    async with contextlib.aclosing(llm.generate(request)) as chunks:
        async for chunk in chunks:
            if chunk.text and first is None:
                first = time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return Sample(((first or end) - start) * 1000, (end - start) * 1000, tokens)


async def through_vigil(client: openai.AsyncOpenAI, question: str, max_tokens: int,
                        stages: list[dict[str, float]]) -> Sample:
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    stream = await client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0,
        stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and first is None:
            first = time.perf_counter()
        if chunk.choices and chunk.choices[0].finish_reason:
            stages.append((chunk.model_extra or {}).get("vigil", {}).get("stage_timings_ms", {}))
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    end = time.perf_counter()
    return Sample(((first or end) - start) * 1000, (end - start) * 1000, tokens)


async def through_vigil_raw(session: aiohttp.ClientSession, url: str, question: str, max_tokens: int,
                            stages: list[dict[str, float]]) -> Sample:
    """The same request read with plain aiohttp: a light client, so its own parsing steals little CPU from the
    server on a small machine (the SDK builds a pydantic object per chunk)."""
    start = time.perf_counter()
    first: float | None = None
    tokens = 0
    body = {"model": MODEL, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(url + "/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            chunk = json.loads(line[6:])
            choices = chunk.get("choices") or []
            if choices and choices[0]["delta"].get("content") and first is None:
                first = time.perf_counter()
            if choices and choices[0].get("finish_reason"):
                stages.append(chunk.get("vigil", {}).get("stage_timings_ms", {}))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return Sample(((first or end) - start) * 1000, (end - start) * 1000, tokens)


async def run_level(call: Callable[[str], Awaitable[Sample]], ask: itertools.cycle[str], concurrency: int,
                    requests: int) -> list[Sample]:
    """``requests`` calls, ``concurrency`` at a time (each worker starts its next one when the last ends)."""
    pending = iter(range(requests))
    samples: list[Sample] = []

    async def worker() -> None:
        for _ in pending:
            samples.append(await call(next(ask)))

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples


def summary(samples: list[Sample]) -> dict[str, float]:
    ttft = sorted(s.ttft_ms for s in samples)
    tpot = [s.tpot_ms for s in samples if s.tpot_ms is not None]
    return {
        "ttft_p50": statistics.median(ttft), "ttft_p90": ttft[min(len(ttft) - 1, round(0.9 * (len(ttft) - 1)))],
        "tpot": statistics.mean(tpot) if tpot else float("nan"),
        "latency": statistics.mean(s.total_ms for s in samples), "tokens": statistics.mean(s.tokens for s in samples),
    }


async def main(args: argparse.Namespace) -> None:
    settings = load_settings(None, {
        "models": {"detector": {"backend": "none"}}, "voice": {"enabled": False},
        "api": {"keys": [{"name": "bench", "key": KEY}], "rate_limit": None, "preload": True,
                "cache": {"semantic": not args.no_semantic_cache},
                "content_filter": {"enabled": not args.no_filter}},
    })
    runner = await start_serving(create_app(settings), "127.0.0.1", 0, shutdown_timeout=5.0)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    api = runner.app[CHAT_SERVICE]
    pipeline = await api.pipeline()
    llm = pipeline.llm  # the very backend object Vigil serves with
    client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0, timeout=600)
    stages: list[dict[str, float]] = []
    ask_direct, ask_vigil = questions(), questions()  # both paths ask the same questions in the same order

    async def call_direct(question: str) -> Sample:
        return await direct(llm, question, args.max_tokens)

    session = aiohttp.ClientSession()

    async def call_vigil(question: str) -> Sample:
        if args.client == "raw":
            return await through_vigil_raw(session, url, question, args.max_tokens, stages)
        return await through_vigil(client, question, args.max_tokens, stages)

    # Warm-up: model pages, llama.cpp's first batch, the embedder's first call, the HTTP connection pool.
    await call_direct("Hello!")
    await call_vigil("Hello there!")
    stages.clear()

    rows: list[tuple[int, str, dict[str, float]]] = []
    ratios: dict[int, float] = {}
    for concurrency in args.concurrency:
        # Short alternating rounds (direct then vigil, then vigil then direct, ...) so load changes on a shared
        # machine hit both paths alike.
        rounds = max(args.rounds, -(-args.min_requests // concurrency))
        results: dict[str, list[Sample]] = {"direct": [], "vigil": []}
        for round_number in range(rounds):
            order = ("direct", "vigil") if round_number % 2 == 0 else ("vigil", "direct")
            for mode in order:
                call, ask = (call_direct, ask_direct) if mode == "direct" else (call_vigil, ask_vigil)
                results[mode] += await run_level(call, ask, concurrency, concurrency)
        for mode in ("direct", "vigil"):
            rows.append((concurrency, mode, summary(results[mode])))
        ratios[concurrency] = summary(results["vigil"])["latency"] / summary(results["direct"])["latency"]

    print(f"\nChat API benchmark: embedded {llm.name}, max_tokens {args.max_tokens}, temperature 0, "
          f"distinct questions (cache misses), streaming, client {args.client}")
    print(f"{'conc':>4} {'path':>7} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'TPOT ms':>9} {'latency ms':>11} "
          f"{'tokens':>7}")
    for concurrency, mode, s in rows:
        print(f"{concurrency:>4} {mode:>7} {s['ttft_p50']:>12.1f} {s['ttft_p90']:>12.1f} {s['tpot']:>9.1f} "
              f"{s['latency']:>11.1f} {s['tokens']:>7.1f}")
    print("\nVigil pipeline overhead (mean request latency, vigil / direct; goal <= 1.05):")
    for concurrency, ratio in ratios.items():
        print(f"  concurrency {concurrency}: {ratio:.3f}  {'ok' if ratio <= 1.05 else 'ABOVE GOAL'}")
    if stages:
        keys = sorted({key for stage in stages for key in stage})
        means = {key: statistics.mean(stage.get(key, 0.0) for stage in stages) for key in keys}
        print("Vigil stage timings, mean ms per request: "
              + ", ".join(f"{key} {means[key]:.2f}" for key in ("ingress", "cache", "prompt", "llm", "filter")
                          if key in means))
    await client.close()
    await session.close()
    await runner.cleanup()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8])
    parser.add_argument("--min-requests", type=int, default=8, help="requests per path and concurrency level")
    parser.add_argument("--rounds", type=int, default=4, help="alternating rounds per level (each: conc requests)")
    parser.add_argument("--client", choices=["sdk", "raw"], default="raw",
                        help="read Vigil's stream with plain aiohttp (default: the client's own parsing then steals "
                        "little CPU from the server on a small machine) or with the openai SDK")
    parser.add_argument("--no-filter", action="store_true", help="turn the content filter off (its cost)")
    parser.add_argument("--no-semantic-cache", action="store_true", help="skip the embedding lookup (its cost)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
