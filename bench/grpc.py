"""gRPC benchmark: what Vigil's gRPC front and LLM router cost and what a second upstream buys.

1. StreamPredict through Vigil vs the same request straight to the upstream (llama.cpp's OpenAI-compatible
   server with SmolLM2): time to first token and decode tokens/s, medians over alternating runs (direct, Vigil,
   Vigil, direct, ...) so drift hits both. Goal: Vigil / direct <= 1.05 for TTFT (and for time per token).
   The upstream runs one thread, leaving a core to Vigil and the client (as a GPU-served upstream would).
2. Unary Predict requests/s at concurrency 1 and 8 through the router (least-connections) with two upstreams
   vs one. The upstreams are identical single-thread llama.cpp servers (replicas), so two is twice the compute.

Vigil runs as its own process (``vigil serve``), as in production; the clients run here. Everything is on
loopback. Run it offline like the tests:
    unshare -n bash -c 'ip link set lo up && PYTHONPATH=$PWD .venv/bin/python -m bench.grpc'
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp
import grpc

from server.grpc_api import inference_pb2 as pb
from server.grpc_api import inference_pb2_grpc as pb_grpc
from tests.support.llm_server import LlmServer
from tests.support.ports import free_port
from tests.support.vigil_process import VigilProcess

MODEL = "smollm2-135m-instruct"
# Long answers, so every run generates exactly max_tokens; each request gets its own opening words so neither
# path is served from llama.cpp's prompt cache.
STORY = "Story number {n}: write a long story about a dragon."
FRANCE = "What is the capital of France?"


class RoutedVigil:
    """``vigil serve`` (tests/support/vigil_process.py) routing to the given upstreams; entered, its gRPC stub."""

    def __init__(self, upstreams: list[str]) -> None:
        self.workdir = Path(tempfile.mkdtemp(prefix="vigil-bench-grpc-"))
        self.grpc_port = free_port()
        self.server = VigilProcess(self.workdir, {
            "voice": {"enabled": False},
            "models": {"detector": {"backend": "none"}, "llm": {
                "backend": "openai", "routing": {"strategy": "least-connections"},
                "upstreams": [{"name": f"u{i}", "base_url": url, "models": [MODEL]} for i, url in enumerate(upstreams)],
            }},
            "grpc": {"host": "127.0.0.1", "port": self.grpc_port},
        })

    async def __aenter__(self) -> pb_grpc.InferenceServiceStub:
        await asyncio.to_thread(self.server.start, 60)
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}")
        await asyncio.wait_for(self.channel.channel_ready(), 60)
        return pb_grpc.InferenceServiceStub(self.channel)

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()
        await asyncio.to_thread(self.server.stop)
        shutil.rmtree(self.workdir, ignore_errors=True)


async def direct_stream(session: aiohttp.ClientSession, url: str, max_tokens: int, n: int,
                        ) -> tuple[float, list[float]]:
    """One streamed chat completion straight to the upstream: (TTFT s, arrival time of each token)."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": STORY.format(n=n)}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True}
    started = time.perf_counter()
    arrivals: list[float] = []
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        async for raw in response.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or ()):
                arrivals.append(time.perf_counter())
    return arrivals[0] - started, arrivals


async def vigil_stream(stub: pb_grpc.InferenceServiceStub, max_tokens: int, n: int) -> tuple[float, list[float]]:
    started = time.perf_counter()
    arrivals = []
    request = pb.PredictRequest(prompt=STORY.format(n=n), max_tokens=max_tokens, model_id=MODEL)
    async for token in stub.StreamPredict(request):
        if token.token:
            arrivals.append(time.perf_counter())
    return arrivals[0] - started, arrivals


def decode_rate(arrivals: list[float]) -> float:
    """Tokens/s from the median gap between tokens: robust to a stall caused by another process."""
    return 1.0 / statistics.median(b - a for a, b in itertools.pairwise(arrivals))


async def streaming_overhead(rounds: int, max_tokens: int) -> None:
    # One llama.cpp thread leaves the other core to Vigil and the client, as an upstream on its own accelerator
    # would: the ratio then shows the latency Vigil adds, not two processes fighting over two cores.
    with LlmServer(n_threads=1) as upstream:
        async with RoutedVigil([upstream.url]) as stub, aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True)) as session:  # as Vigil's client: no keep-alive
            await direct_stream(session, upstream.url, 4, -1)  # warm both paths up
            await vigil_stream(stub, 4, -2)
            results: dict[str, list[tuple[float, list[float]]]] = {"direct": [], "vigil": []}
            for index in range(rounds):
                order = ["direct", "vigil"] if index % 2 == 0 else ["vigil", "direct"]
                for path in order:
                    n = 2 * index + (path == "vigil")
                    run = (await direct_stream(session, upstream.url, max_tokens, n) if path == "direct"
                           else await vigil_stream(stub, max_tokens, n))
                    results[path].append(run)
    ttft = {path: [r[0] * 1000 for r in runs] for path, runs in results.items()}
    rate = {path: [decode_rate(r[1]) for r in runs] for path, runs in results.items()}
    tokens = {path: {len(r[1]) for r in runs} for path, runs in results.items()}
    # Other processes on the machine come and go: the headline ratios compare the two runs of each round (taken
    # back to back), and "best" compares each path's best run (its cost with the least interference).
    paired_ttft = statistics.median(v / d for v, d in zip(ttft["vigil"], ttft["direct"], strict=True))
    paired_tpt = statistics.median(d / v for v, d in zip(rate["vigil"], rate["direct"], strict=True))
    print(f"\nStreamPredict vs the upstream directly ({rounds} rounds, the two paths back to back in alternating "
          f"order; {max_tokens} tokens asked, got {sorted(tokens['direct'])} direct / {sorted(tokens['vigil'])} "
          "via Vigil)")
    def cell(values: list[float], best: float) -> str:
        return f"{statistics.median(values):.1f} / {best:.1f}"

    print(f"{'':28}{'direct':>14}{'via Vigil':>14}{'paired ratio':>14}{'best/best':>11}")
    print(f"{'TTFT ms (median / best)':28}{cell(ttft['direct'], min(ttft['direct'])):>14}"
          f"{cell(ttft['vigil'], min(ttft['vigil'])):>14}{paired_ttft:>14.3f}"
          f"{min(ttft['vigil']) / min(ttft['direct']):>11.3f}   (Vigil / direct, goal <= 1.05)")
    print(f"{'decode tok/s (median / best)':28}{cell(rate['direct'], max(rate['direct'])):>14}"
          f"{cell(rate['vigil'], max(rate['vigil'])):>14}{paired_tpt:>14.3f}"
          f"{max(rate['direct']) / max(rate['vigil']):>11.3f}   (time per token, Vigil / direct, goal <= 1.05)")


async def throughput(stub: pb_grpc.InferenceServiceStub, concurrency: int, requests: int, max_tokens: int) -> float:
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(requests):
        queue.put_nowait(index)

    async def worker() -> None:
        while not queue.empty():
            queue.get_nowait()
            response = await stub.Predict(pb.PredictRequest(prompt=FRANCE, max_tokens=max_tokens, model_id=MODEL))
            assert response.usage.completion_tokens > 0

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return requests / (time.perf_counter() - started)


async def routing_scale_out(requests: int, max_tokens: int, reps: int) -> None:
    """Both set-ups run side by side (an idle Vigil costs nothing) and take turns, so drift hits both."""
    done: dict[tuple[int, int], tuple[int, float]] = {}
    with LlmServer(n_threads=1) as first, LlmServer(n_threads=1) as second:
        async with RoutedVigil([first.url]) as one, RoutedVigil([first.url, second.url]) as two:
            stubs = {1: one, 2: two}
            for stub in stubs.values():
                await throughput(stub, 2, 2, max_tokens)  # warm-up
            for concurrency in (1, 8):
                for rep in range(reps):
                    for upstreams in ((1, 2) if rep % 2 == 0 else (2, 1)):
                        started = time.perf_counter()
                        await throughput(stubs[upstreams], concurrency, requests // reps, max_tokens)
                        count, seconds = done.get((upstreams, concurrency), (0, 0.0))
                        done[(upstreams, concurrency)] = (count + requests // reps,
                                                          seconds + time.perf_counter() - started)
    print(f"\nUnary Predict requests/s through the router ({requests} requests of {max_tokens} tokens each per cell, "
          f"in {reps} alternating batches; single-thread llama.cpp replicas)")
    print(f"{'concurrency':<14}{'1 upstream':>12}{'2 upstreams':>13}{'ratio':>10}")
    for concurrency in (1, 8):
        one, two = (done[(n, concurrency)][0] / done[(n, concurrency)][1] for n in (1, 2))
        print(f"{concurrency:<14}{one:>12.2f}{two:>13.2f}{two / one:>10.2f}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=10, help="StreamPredict runs per path")
    parser.add_argument("--stream-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=48, help="Predict requests per throughput cell")
    parser.add_argument("--predict-tokens", type=int, default=16)
    parser.add_argument("--batches", type=int, default=4, help="alternating batches per throughput cell")
    parser.add_argument("--skip-routing", action="store_true", help="only the StreamPredict comparison")
    args = parser.parse_args()
    print(f"bench.grpc on {os.cpu_count()} CPU(s); SmolLM2-135M on llama.cpp (xllamacpp), Vigil as `vigil serve`")
    await streaming_overhead(args.rounds, args.stream_tokens)
    if not args.skip_routing:
        await routing_scale_out(args.requests, args.predict_tokens, args.batches)


if __name__ == "__main__":
    asyncio.run(main())
