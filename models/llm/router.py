"""One ``LanguageModel`` over several OpenAI-compatible upstreams (e.g. vLLM replicas), with a routing strategy.

Per request the router takes the upstreams that are healthy and serve the requested model, lets the configured
strategy rank them, and streams from the first. An upstream that fails *before its first token* (refused, 5xx,
timed out) is ejected and the request is retried on the next one, so the caller never sees that failure; after
the first token an error propagates (the caller already has part of an answer). Periodic health checks
(``GET /v1/models``) eject upstreams that stop answering and re-admit them when they answer again; when no
upstream is eligible, the ejected ones are probed right away (at most once per ``probe_interval_s`` each), so an
upstream that came back serves the next request without waiting for the next periodic check. When none is
eligible the caller gets ``LlmUnavailable`` saying why (no upstream serves the model, or all are down).

Strategies are small classes that rank candidates; all see the same per-upstream state (in-flight requests, a
moving average of time to first token, the last time each was picked):

* ``least-connections``: fewest in-flight requests; ties go to the least recently picked (round robin).
* ``least-latency``: lowest expected wait, the TTFT moving average times (1 + in-flight); an upstream with no
  measurement yet is tried first so every upstream gets measured.
* ``model-affinity``: a conversation (``LlmRequest.conversation_id``) stays on the upstream that served it
  before, so that upstream's prefix/KV cache is reused; when that one is unhealthy it moves (and stays) on
  another. New conversations and requests without an id go by least-connections.
* ``cost-aware``: prefer upstreams that are busy but below ``saturation`` in-flight requests (the busiest
  first, packing load), then idle ones (cheapest, most recently used first: likely still warm), then saturated
  ones (least loaded first). Idle upstreams are thereby left idle (scale to zero) until the busy ones saturate.

Per-upstream Prometheus metrics: in-flight gauge, TTFT histogram, request and error counters, health gauge.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import math
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

import aiohttp
from prometheus_client import Counter, Gauge, Histogram

from models.llm import ChatMessage, LlmRequest, LlmRequestError, LlmUnavailable, TextStream, TokenChunk
from models.llm.openai_chat import FinalMessage, OpenAiLlm

log = logging.getLogger(__name__)

ANY_MODEL = "*"  # an upstream configured with this model id serves whatever model is asked for

IN_FLIGHT = Gauge("vigil_llm_upstream_in_flight", "Requests in flight per LLM upstream.", ["upstream"])
REQUESTS = Counter("vigil_llm_upstream_requests_total", "Requests routed to each LLM upstream.", ["upstream"])
ERRORS = Counter("vigil_llm_upstream_errors_total", "Failed requests per LLM upstream, by when they failed "
                 "(before_first_token, after_first_token, rejected).", ["upstream", "kind"])
TTFT = Histogram("vigil_llm_upstream_ttft_seconds", "Time to first token per LLM upstream.", ["upstream"],
                 buckets=(0.025, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4, 12.8))
HEALTHY = Gauge("vigil_llm_upstream_healthy", "1 while an LLM upstream is admitted, 0 while ejected.", ["upstream"])


@dataclass(frozen=True)
class UpstreamConfig:
    name: str
    base_url: str
    models: tuple[str, ...] = ()  # empty: discovered from GET /v1/models; ("*",): any model
    api_key: str | None = None
    cost: float = 1.0
    context_window: int = 4096
    final_message: FinalMessage = "no"  # how it goes on from a last assistant message (openai_chat.FinalMessage)


@dataclass(frozen=True)
class RoutingConfig:
    strategy: str = "least-connections"
    saturation: int = 4
    health_interval_s: float = 5.0
    health_timeout_s: float = 2.0
    request_timeout_s: float = 30.0
    latency_alpha: float = 0.3
    max_attempts: int = 3
    affinity_conversations: int = 10000
    probe_interval_s: float = 0.5


class Upstream:
    """One OpenAI-compatible server and what the router knows about it."""

    _picks = itertools.count(1)

    def __init__(self, config: UpstreamConfig, request_timeout_s: float) -> None:
        self.config = config
        self.name = config.name
        self.llm = OpenAiLlm(config.base_url, config.models[0] if config.models else "", api_key=config.api_key,
                             timeout=request_timeout_s, context_window=config.context_window,
                             final_message=config.final_message)
        self.models: set[str] = set(config.models)
        self.healthy = True  # admitted until a check or a request says otherwise
        self.reason = ""  # why it was last ejected
        self.in_flight = 0
        self.requests = 0
        self.errors = 0
        self.ttft_s: float | None = None  # moving average of time to first token
        self.last_pick = 0  # order of the last pick, for round-robin tie-breaks
        self.probes = 0  # on-demand health checks while ejected (see RoutedLlm._probe_ejected)
        self.last_probe = -math.inf  # time.monotonic() of the last one
        self.probe: asyncio.Task[None] | None = None  # the one in flight, shared by concurrent requests
        HEALTHY.labels(upstream=self.name).set(1)

    def serves(self, model: str) -> bool:
        return ANY_MODEL in self.models or model in self.models

    def begin(self) -> None:
        """Counted synchronously at pick time, so concurrent picks see each other."""
        self.in_flight += 1
        self.requests += 1
        self.last_pick = next(self._picks)
        IN_FLIGHT.labels(upstream=self.name).inc()
        REQUESTS.labels(upstream=self.name).inc()

    def end(self) -> None:
        self.in_flight -= 1
        IN_FLIGHT.labels(upstream=self.name).dec()

    def first_token(self, seconds: float, alpha: float) -> None:
        self.ttft_s = seconds if self.ttft_s is None else alpha * seconds + (1 - alpha) * self.ttft_s
        TTFT.labels(upstream=self.name).observe(seconds)

    def failed(self, kind: str) -> None:
        self.errors += 1
        ERRORS.labels(upstream=self.name, kind=kind).inc()

    def set_health(self, healthy: bool, reason: str = "") -> None:
        if healthy != self.healthy:
            log.warning("LLM upstream %s %s%s", self.name, "re-admitted" if healthy else "ejected",
                        "" if healthy else f": {reason}")
        self.healthy, self.reason = healthy, ("" if healthy else reason)
        HEALTHY.labels(upstream=self.name).set(1 if healthy else 0)

    def stats(self) -> dict[str, object]:
        return {
            "name": self.name, "base_url": self.config.base_url, "models": sorted(self.models),
            "healthy": self.healthy, "reason": self.reason, "in_flight": self.in_flight,
            "requests": self.requests, "errors": self.errors, "probes": self.probes,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000.0, 1),
        }


class Strategy(Protocol):
    def rank(self, candidates: list[Upstream], request: LlmRequest) -> list[Upstream]:
        """Candidates (healthy, serving the model; never empty) in order of preference."""

    def served(self, request: LlmRequest, upstream: Upstream) -> None:
        """``upstream`` produced the first token of ``request``."""


class LeastConnections:
    def rank(self, candidates: list[Upstream], request: LlmRequest) -> list[Upstream]:
        return sorted(candidates, key=lambda u: (u.in_flight, u.last_pick))

    def served(self, request: LlmRequest, upstream: Upstream) -> None:
        return None


class LeastLatency:
    def rank(self, candidates: list[Upstream], request: LlmRequest) -> list[Upstream]:
        def expected_wait(u: Upstream) -> tuple[float, int]:
            # Unmeasured first (so each gets measured); then TTFT scaled by the queue it would join.
            return (-1.0 if u.ttft_s is None else u.ttft_s * (1 + u.in_flight), u.last_pick)

        return sorted(candidates, key=expected_wait)

    def served(self, request: LlmRequest, upstream: Upstream) -> None:
        return None


class ModelAffinity:
    def __init__(self, max_conversations: int) -> None:
        self._home: OrderedDict[str, str] = OrderedDict()  # conversation id -> upstream name, LRU
        self._max = max_conversations

    def home(self, conversation_id: str) -> str | None:
        return self._home.get(conversation_id)

    def rank(self, candidates: list[Upstream], request: LlmRequest) -> list[Upstream]:
        ranked = LeastConnections().rank(candidates, request)
        home = self._home.get(request.conversation_id or "")
        return sorted(ranked, key=lambda u: u.name != home)  # stable: the home first, the rest as ranked

    def served(self, request: LlmRequest, upstream: Upstream) -> None:
        if request.conversation_id:
            self._home[request.conversation_id] = upstream.name
            self._home.move_to_end(request.conversation_id)
            while len(self._home) > self._max:
                self._home.popitem(last=False)


class CostAware:
    def __init__(self, saturation: int) -> None:
        self.saturation = saturation

    def rank(self, candidates: list[Upstream], request: LlmRequest) -> list[Upstream]:
        def preference(u: Upstream) -> tuple[int, float, float, int]:
            cost = u.config.cost
            if 0 < u.in_flight < self.saturation:  # busy with room left: cheapest to add to; fill the busiest
                return (0, cost, -u.in_flight, -u.last_pick)
            if u.in_flight == 0:  # idle: would have to be woken; the cheapest, most recently used first
                return (1, cost, 0, -u.last_pick)
            return (2, u.in_flight, cost, u.last_pick)  # saturated: the least overloaded first

        return sorted(candidates, key=preference)

    def served(self, request: LlmRequest, upstream: Upstream) -> None:
        return None


def make_strategy(config: RoutingConfig) -> Strategy:
    if config.strategy == "least-connections":
        return LeastConnections()
    if config.strategy == "least-latency":
        return LeastLatency()
    if config.strategy == "model-affinity":
        return ModelAffinity(config.affinity_conversations)
    if config.strategy == "cost-aware":
        return CostAware(config.saturation)
    raise ValueError(f"unknown routing strategy {config.strategy!r}")


class RoutedLlm(TextStream):
    """``LanguageModel`` over several upstreams. Use one instance per event loop (it holds HTTP sessions and a
    health-check task, started on first use or by ``start()``)."""

    def __init__(self, upstreams: Iterable[UpstreamConfig], default_model: str,
                 config: RoutingConfig | None = None) -> None:
        self.config = config or RoutingConfig()
        self.upstreams = [Upstream(u, self.config.request_timeout_s) for u in upstreams]
        if not self.upstreams:
            raise ValueError("the router needs at least one upstream")
        self.default_model = default_model
        self.name = default_model
        self.context_window = min(u.config.context_window for u in self.upstreams)
        # Any upstream may take a request: a last assistant message is continued only if every one continues it.
        self.continues_final_message = all(u.llm.continues_final_message for u in self.upstreams)
        self.strategy = make_strategy(self.config)
        self._health_task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ lifecycle and health

    async def start(self) -> None:
        """First health check (which also discovers models where none are configured), then periodic ones."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            try:
                await self.check_health()
            finally:
                self._started.set_result(None)
            self._health_task = asyncio.create_task(self._health_loop(), name="llm-router:health")
        await asyncio.shield(self._started)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.health_interval_s)
            try:
                await self.check_health()
            except Exception:  # a bug here must not end health checking for good
                log.exception("LLM upstream health check failed")

    def _health_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(force_close=True),
                timeout=aiohttp.ClientTimeout(total=self.config.health_timeout_s),
            )
        return self._session

    async def check_health(self) -> None:
        session = self._health_session()
        await asyncio.gather(*(self._check(u, session) for u in self.upstreams))

    async def _probe_ejected(self, model: str, tried: set[str]) -> None:
        """Nothing eligible: check the ejected upstreams that serve ``model`` now rather than make the caller
        wait for (or fail until) the next periodic check; an upstream that came back is re-admitted at once.
        Each upstream is probed at most once per ``probe_interval_s``; concurrent requests share one probe."""
        probes: list[asyncio.Task[None]] = []
        now = time.monotonic()
        for upstream in self.upstreams:
            if upstream.healthy or not upstream.serves(model) or upstream.name in tried:
                continue
            if upstream.probe is None and now - upstream.last_probe >= self.config.probe_interval_s:
                upstream.probes += 1
                upstream.last_probe = now
                upstream.probe = asyncio.create_task(self._check(upstream, self._health_session()),
                                                     name=f"llm-router:probe:{upstream.name}")
                upstream.probe.add_done_callback(lambda _, u=upstream: setattr(u, "probe", None))
            if upstream.probe is not None:
                probes.append(upstream.probe)
        if probes:  # shielded: a cancelled caller must not cancel a probe other requests wait on
            await asyncio.shield(asyncio.gather(*probes, return_exceptions=True))

    async def _check(self, upstream: Upstream, session: aiohttp.ClientSession) -> None:
        base = upstream.config.base_url.rstrip("/")
        url = (base if base.endswith("/v1") else base + "/v1") + "/models"
        headers = {"Authorization": f"Bearer {upstream.config.api_key}"} if upstream.config.api_key else None
        try:
            async with session.get(url, headers=headers) as response:
                if response.status != 200:
                    upstream.set_health(False, f"GET {url} answered HTTP {response.status}")
                    return
                listed = [m.get("id") for m in (await response.json()).get("data") or () if isinstance(m, dict)]
        except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError) as exc:
            upstream.set_health(False, f"GET {url} failed: {exc or type(exc).__name__}")
            return
        if not upstream.config.models:
            upstream.models = {m for m in listed if isinstance(m, str)}
        upstream.set_health(True)

    async def close(self) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
            self._health_task = None
        self._started = None
        probes = [u.probe for u in self.upstreams if u.probe is not None]
        for probe in probes:
            probe.cancel()
        await asyncio.gather(*probes, return_exceptions=True)
        for upstream in self.upstreams:
            await upstream.llm.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    # ------------------------------------------------------------------ routing

    def stats(self) -> list[dict[str, object]]:
        return [u.stats() for u in self.upstreams]

    def upstream(self, name: str) -> Upstream:
        return next(u for u in self.upstreams if u.name == name)

    def _no_upstream(self, model: str, failures: list[str]) -> LlmUnavailable:
        if failures:
            return LlmUnavailable(f"every upstream tried for model {model!r} failed before its first token: "
                                  + "; ".join(failures))
        serving = [u for u in self.upstreams if u.serves(model)]
        if not serving:
            offered = ", ".join(f"{u.name} ({', '.join(sorted(u.models)) or 'none'})" for u in self.upstreams)
            return LlmUnavailable(f"no LLM upstream serves model {model!r}; upstreams: {offered}")
        down = ", ".join(f"{u.name} ({u.reason or 'ejected'})" for u in serving)
        return LlmUnavailable(f"no healthy LLM upstream for model {model!r}: {down}")

    async def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        await self.start()
        model = request.model or self.default_model
        upstream_request = dataclasses.replace(request, model=model)
        tried: set[str] = set()
        failures: list[str] = []
        while len(tried) < self.config.max_attempts:
            candidates = [u for u in self.upstreams if u.healthy and u.serves(model) and u.name not in tried]
            if not candidates:
                await self._probe_ejected(model, tried)
                candidates = [u for u in self.upstreams if u.healthy and u.serves(model) and u.name not in tried]
            if not candidates:
                break
            upstream = self.strategy.rank(candidates, request)[0]
            tried.add(upstream.name)
            upstream.begin()  # synchronously after ranking: the next pick already sees this request
            try:
                generation = upstream.llm.generate(upstream_request)
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(self.config.request_timeout_s):
                        first: TokenChunk | None = await anext(generation)
                except StopAsyncIteration:
                    first = None  # an empty answer is still an answer
                except (LlmUnavailable, TimeoutError) as error:
                    reason = str(error) or f"no first token within {self.config.request_timeout_s:g} s"
                    upstream.failed("before_first_token")
                    upstream.set_health(False, reason)  # passive ejection; the health check re-admits it
                    failures.append(f"{upstream.name}: {reason}")
                    await generation.aclose()
                    continue
                except LlmRequestError:
                    upstream.failed("rejected")
                    raise
                upstream.first_token(time.perf_counter() - started, self.config.latency_alpha)
                self.strategy.served(request, upstream)
                async with contextlib.aclosing(generation):
                    if first is not None:
                        yield first
                    try:
                        async for chunk in generation:
                            yield chunk
                    except LlmUnavailable:
                        upstream.failed("after_first_token")
                        raise
                return
            finally:
                upstream.end()
        raise self._no_upstream(model, failures)

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        return self.upstreams[0].llm.count_tokens(messages)  # the same approximation for every upstream
