"""Per-request stage timings of the serving pipeline and its Prometheus metrics."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram

STAGE_MS = Histogram(
    "vigil_api_stage_ms", "Serving pipeline stage latency per request (ingress, cache, prompt, llm, filter), ms.",
    ["stage"], buckets=(0.1, 0.25, 0.5, 1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000),
)
CACHE_LOOKUPS = Counter(
    "vigil_api_cache_total", "Chat cache lookups by result (exact, semantic, miss, bypass).", ["result"]
)
CHAT_REQUESTS = Counter(
    "vigil_api_chat_requests_total", "Chat completions by outcome (stop, length, content_filter, disconnected, "
    "error).", ["outcome"],
)
FILTER_ACTIONS = Counter("vigil_api_content_filter_total", "Content filter actions (masked PII kinds, blocked).",
                         ["action"])
RATE_LIMITED = Counter("vigil_api_rate_limited_total", "Requests refused by the rate limit, by API key name.",
                       ["key"])


class StageTimer:
    """Milliseconds spent per stage; a stage entered several times (e.g. filtering each chunk) adds up."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}

    def add(self, stage: str, ms: float) -> None:
        self.ms[stage] = self.ms.get(stage, 0.0) + ms

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, (time.perf_counter() - start) * 1000)

    def header(self) -> str:
        """``ingress=0.31;cache=1.20;...`` (ms), for the X-Vigil-Stage-Timings response header."""
        return ";".join(f"{stage}={ms:.2f}" for stage, ms in self.ms.items())

    def rounded(self) -> dict[str, float]:
        return {stage: round(ms, 3) for stage, ms in self.ms.items()}

    def observe(self) -> None:
        for stage, ms in self.ms.items():
            STAGE_MS.labels(stage=stage).observe(ms)
