"""The LLM router over real upstreams: two llama.cpp servers (child processes) serving SmolLM2, and a third,
tiny real HTTP server that only claims another model. Which upstream served what is checked both on the
router's own counters and on what each llama.cpp server reports (tokens predicted), so a miscount cannot hide.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from models.llm import ChatMessage, LlmRequest, LlmUnavailable
from models.llm.router import RoutedLlm, RoutingConfig, UpstreamConfig
from server.config import load_settings
from server.engines import Engines
from tests.support.llm_server import LlmServer

MODEL = "smollm2-135m-instruct"
OTHER_MODEL = "other-model"
TOKENS = 4  # every answer here is longer, so each request predicts exactly this many tokens
QUESTION = [ChatMessage("user", "What is the capital of France?")]


class OtherModelOnlyUpstreamForTest:
    """Named seam: a real HTTP server that lists only OTHER_MODEL and answers chat completions with a fixed
    two-chunk stream, counting the requests it gets (none may be for MODEL)."""

    def __init__(self) -> None:
        self.requested_models: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def do_GET(self) -> None:
                self._send(200, "application/json", json.dumps({"data": [{"id": OTHER_MODEL}]}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requested_models.append(body.get("model"))
                chunks = [{"choices": [{"delta": {"content": "other"}, "finish_reason": None}]},
                          {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
                payload = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
                self._send(200, "text/event-stream", payload.encode())

            def _send(self, status: int, content_type: str, data: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture(scope="module")
def llama_a() -> Iterator[LlmServer]:
    with LlmServer(n_threads=1) as server:  # one thread each: both decode at once on two cores
        yield server


@pytest.fixture(scope="module")
def llama_b() -> Iterator[LlmServer]:
    with LlmServer(n_threads=1) as server:
        yield server


@pytest.fixture(scope="module")
def other() -> Iterator[OtherModelOnlyUpstreamForTest]:
    server = OtherModelOnlyUpstreamForTest()
    yield server
    server.close()


def upstreams(a: str, b: str, other: str) -> list[UpstreamConfig]:
    return [UpstreamConfig("a", a, (MODEL,)), UpstreamConfig("b", b, (MODEL,)),
            UpstreamConfig("other", other)]  # no models configured: discovered from its /v1/models


@contextlib.asynccontextmanager
async def router(a: str, b: str, other: str, **routing: object) -> AsyncIterator[RoutedLlm]:
    llm = RoutedLlm(upstreams(a, b, other), MODEL, RoutingConfig(**routing))  # type: ignore[arg-type]
    try:
        yield llm
    finally:
        await llm.close()


async def ask(llm: RoutedLlm, conversation: str | None = None, model: str | None = None) -> str:
    request = LlmRequest(QUESTION, max_tokens=TOKENS, conversation_id=conversation, model=model)
    async with contextlib.aclosing(llm.stream(request)) as deltas:
        return "".join([delta async for delta in deltas])


def served(llm: RoutedLlm) -> dict[str, int]:
    return {u.name: u.requests - u.errors for u in llm.upstreams}


class PredictedTokens:
    """What each llama.cpp server itself says it generated since this was made."""

    def __init__(self, **servers: LlmServer) -> None:
        self.servers = servers
        self.before = {name: s.metrics()["tokens_predicted_total"] for name, s in servers.items()}

    def requests(self) -> dict[str, int]:
        return {name: round((s.metrics()["tokens_predicted_total"] - self.before[name]) / TOKENS)
                for name, s in self.servers.items()}


async def test_least_connections_spreads_concurrent_and_sequential_requests(llama_a, llama_b, other):
    count = PredictedTokens(a=llama_a, b=llama_b)
    async with router(llama_a.url, llama_b.url, other.url, strategy="least-connections") as llm:
        answers = await asyncio.gather(*(ask(llm) for _ in range(4)))  # each pick sees the others in flight
        assert len(set(answers)) == 1 and answers[0]
        assert served(llm) == {"a": 2, "b": 2, "other": 0}
        for _ in range(4):  # one at a time: ties go round robin
            assert await ask(llm) == answers[0]
        assert served(llm) == {"a": 4, "b": 4, "other": 0}
        assert count.requests() == {"a": 4, "b": 4}
        assert other.requested_models.count(MODEL) == 0
        assert REGISTRY.get_sample_value("vigil_llm_upstream_in_flight", {"upstream": "a"}) == 0
        assert llm.upstream("a").ttft_s is not None


async def test_only_upstreams_serving_the_model_are_eligible(llama_a, llama_b, other):
    async with router(llama_a.url, llama_b.url, other.url) as llm:
        before = len(other.requested_models)
        assert await ask(llm, model=OTHER_MODEL) == "other"
        assert await ask(llm, model=OTHER_MODEL) == "other"
        assert other.requested_models[before:] == [OTHER_MODEL, OTHER_MODEL]
        assert served(llm) == {"a": 0, "b": 0, "other": 2}
        assert llm.upstream("other").models == {OTHER_MODEL}  # discovered from its /v1/models
        with pytest.raises(LlmUnavailable, match=r"no LLM upstream serves model 'no-such-model'.*a \("):
            await ask(llm, model="no-such-model")


class DelayingProxyForTest:
    """Named seam: a real HTTP reverse proxy that holds each chat request for ``delay_s`` before forwarding it,
    making its upstream measurably slower to the first token."""

    def __init__(self, target: str, delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def start(self) -> DelayingProxyForTest:
        async def forward(request: web.Request) -> web.StreamResponse:
            import aiohttp

            if request.method == "POST":
                await asyncio.sleep(self.delay_s)
            async with aiohttp.ClientSession() as session, session.request(
                request.method, self.target + request.path, data=await request.read(),
                headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
            ) as upstream:
                response = web.StreamResponse(status=upstream.status,
                                              headers={"Content-Type": upstream.headers["Content-Type"]})
                await response.prepare(request)
                async for data in upstream.content.iter_any():
                    await response.write(data)
                await response.write_eof()
                return response

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


async def test_least_latency_prefers_the_faster_upstream(llama_a, llama_b, other):
    proxy = await DelayingProxyForTest(llama_b.url, delay_s=0.5).start()
    count = PredictedTokens(a=llama_a, b=llama_b)
    try:
        async with router(llama_a.url, proxy.url, other.url, strategy="least-latency") as llm:
            for _ in range(6):
                await ask(llm)
            # each is measured once, then the slower one (b, behind the proxy) is left alone
            assert served(llm) == {"a": 5, "b": 1, "other": 0}
            assert llm.upstream("b").ttft_s > llm.upstream("a").ttft_s + 0.4
            assert count.requests() == {"a": 5, "b": 1}
    finally:
        await proxy.close()


async def test_model_affinity_keeps_each_conversation_on_one_upstream(llama_a, llama_b, other):
    async with router(llama_a.url, llama_b.url, other.url, strategy="model-affinity") as llm:
        homes: dict[str, set[str]] = {}
        for _ in range(3):  # three turns of four interleaved conversations
            for conversation in ("c1", "c2", "c3", "c4"):
                before = {u.name: u.requests for u in llm.upstreams}
                await ask(llm, conversation)
                (picked,) = [u.name for u in llm.upstreams if u.requests > before[u.name]]
                homes.setdefault(conversation, set()).add(picked)
        assert all(len(h) == 1 for h in homes.values()), homes
        assert sorted(next(iter(h)) for h in homes.values()) == ["a", "a", "b", "b"]  # new ones spread
        # The home of c1 becomes unhealthy: c1 moves to the other upstream and stays there.
        home = next(iter(homes["c1"]))
        away = "b" if home == "a" else "a"
        llm.upstream(home).set_health(False, "ejected by the test")
        await ask(llm, "c1")
        llm.upstream(home).set_health(True)
        before = llm.upstream(away).requests
        await ask(llm, "c1")
        assert llm.upstream(away).requests == before + 1
        assert llm.strategy.home("c1") == away  # type: ignore[attr-defined]


async def test_cost_aware_packs_busy_upstreams_before_waking_idle_ones(llama_a, llama_b, other):
    count = PredictedTokens(a=llama_a, b=llama_b)
    async with router(llama_a.url, llama_b.url, other.url, strategy="cost-aware", saturation=2) as llm:
        for _ in range(3):  # one at a time: always the same (warm) upstream; the other is never woken
            await ask(llm)
        warm = max(served(llm), key=lambda name: served(llm)[name])
        cold = "b" if warm == "a" else "a"
        assert served(llm)[warm] == 3 and served(llm)[cold] == 0
        await asyncio.gather(ask(llm), ask(llm))  # two at once still fit under saturation=2
        assert served(llm)[warm] == 5 and served(llm)[cold] == 0
        await asyncio.gather(*(ask(llm) for _ in range(4)))  # four: the warm one saturates, then the other
        assert served(llm) == {warm: 7, cold: 2, "other": 0}
        assert count.requests() == {warm: 7, cold: 2}


class LongGenerationForTest:
    """Occupies an upstream's only llama.cpp slot with a long streamed answer requested directly (not through
    the router), so every routed request sent there queues inside llama.cpp without a first token."""

    def __init__(self, server: LlmServer) -> None:
        self.server = server
        self.first_token = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        import aiohttp

        body = {"model": MODEL, "stream": True, "max_tokens": 1500, "temperature": 0,
                "messages": [{"role": "user", "content": "Write a very long story about a dragon."}]}
        with contextlib.suppress(aiohttp.ClientError):  # it ends when its server is killed
            async with aiohttp.ClientSession() as session, \
                    session.post(self.server.url + "/v1/chat/completions", json=body) as response:
                async for _ in response.content:
                    self.first_token.set()

    async def __aenter__(self) -> LongGenerationForTest:
        self.task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.first_token.wait(), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def test_killing_an_upstream_mid_run_loses_no_request_and_it_is_readmitted(llama_b, other):
    a = await asyncio.to_thread(LlmServer(n_threads=1).start)  # this one gets SIGKILLed
    try:
        async with router(a.url, llama_b.url, other.url, health_interval_s=0.2) as llm:
            await llm.start()
            reference = await ask(llm)
            b_tokens = PredictedTokens(b=llama_b)
            async with LongGenerationForTest(a):
                # Six at once: least-connections sends three to a, where they queue behind the long answer.
                answers = asyncio.gather(*(ask(llm) for _ in range(6)))
                await until(lambda: a.metrics()["requests_deferred"] == 3 and llm.upstream("a").in_flight == 3)
                assert not answers.done()
                await asyncio.to_thread(a.stop, hard=True)  # SIGKILL, with requests in flight
                assert await answers == [reference] * 6, "a request was lost or answered wrongly"
            stats = {s["name"]: s for s in llm.stats()}
            assert stats["a"]["errors"] == 3 and stats["b"]["errors"] == 0
            assert REGISTRY.get_sample_value("vigil_llm_upstream_errors_total",
                                             {"upstream": "a", "kind": "before_first_token"}) >= 3
            # b generated each of the six answers exactly once: none lost, none answered twice.
            assert b_tokens.requests() == {"b": 6}
            assert not llm.upstream("a").healthy
            # It comes back on the same port: the periodic health check re-admits it and it is used again.
            await asyncio.to_thread(a.start)
            await until(lambda: llm.upstream("a").healthy)
            a_tokens = PredictedTokens(a=a)
            assert await asyncio.gather(ask(llm), ask(llm)) == [reference] * 2
            assert a_tokens.requests() == {"a": 1}
    finally:
        await asyncio.to_thread(a.stop)


async def test_no_healthy_upstream_gives_a_clear_error(other):
    async with router("http://127.0.0.1:9", "http://127.0.0.1:9", other.url) as llm:
        await llm.start()
        assert not llm.upstream("a").healthy and not llm.upstream("b").healthy  # nothing listens on port 9
        with pytest.raises(LlmUnavailable, match=r"no healthy LLM upstream for model .*a \(GET .*/v1/models failed"):
            await ask(llm)
        assert llm.upstream("a").probes == 1  # probed once more before giving up


async def test_the_engines_build_the_router_from_config(llama_a, llama_b):
    settings = load_settings(None, {"models": {"llm": {
        "backend": "openai",
        "upstreams": [{"name": "a", "base_url": llama_a.url, "models": [MODEL]},
                      {"name": "b", "base_url": llama_b.url + "/v1", "models": [MODEL]}],
        "routing": {"strategy": "least-latency", "health_interval_s": 1},
    }}})
    engines = Engines(settings)
    llm = engines.llm()
    try:
        assert isinstance(llm, RoutedLlm) and llm.config.strategy == "least-latency"
        assert engines.llm() is llm  # the voice loop, chat API and gRPC of one app share one router
        assert await ask(llm) and await ask(llm)
        assert {u.name: u.requests for u in llm.upstreams} == {"a": 1, "b": 1}
    finally:
        await engines.close()  # the app's engines close its router
    single_engines = Engines(load_settings(None, {"models": {"llm": {"backend": "openai", "base_url": llama_a.url}}}))
    single = single_engines.llm()
    try:
        assert await ask(single, model="whatever-the-client-calls-it")  # one plain upstream serves any name
    finally:
        await single_engines.close()


async def until(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_an_ejected_upstream_is_probed_when_none_is_eligible():
    server = await asyncio.to_thread(LlmServer(n_threads=1).start)
    solo = [UpstreamConfig("solo", server.url, (MODEL,))]
    # No periodic checks during the test: only the on-demand probe can re-admit the upstream.
    bounded = RoutedLlm(solo, MODEL, RoutingConfig(health_interval_s=3600, probe_interval_s=3600))
    prompt = RoutedLlm(solo, MODEL, RoutingConfig(health_interval_s=3600))  # probe_interval_s: default 0.5
    try:
        reference = await ask(bounded)
        assert await ask(prompt) == reference
        await asyncio.to_thread(server.stop, hard=True)
        for llm in (bounded, prompt):  # the request that finds it dead ejects it (passive ejection)
            with pytest.raises(LlmUnavailable, match="failed before its first token"):
                await ask(llm)
            assert not llm.upstream("solo").healthy and llm.upstream("solo").probes == 0
        # Nothing eligible: the ejected upstream is probed first; still down, so a clear UNAVAILABLE.
        with pytest.raises(LlmUnavailable, match=r"no healthy LLM upstream .*solo \(GET .*/v1/models failed"):
            await ask(bounded)
        assert bounded.upstream("solo").probes == 1
        with pytest.raises(LlmUnavailable, match="no healthy LLM upstream"):
            await asyncio.gather(ask(bounded), ask(bounded))
        assert bounded.upstream("solo").probes == 1  # at most one probe per probe_interval_s
        await asyncio.to_thread(server.start)  # back on the same port
        assert await ask(prompt) == reference  # probed and re-admitted at once, long before any periodic check
        assert prompt.upstream("solo").healthy and prompt.upstream("solo").probes == 1
        with pytest.raises(LlmUnavailable, match="no healthy LLM upstream"):
            await ask(bounded)  # its next probe is not due yet
    finally:
        await bounded.close()
        await prompt.close()
        await asyncio.to_thread(server.stop)

