"""vigil_event_loop_lag_ms: a blocked event loop shows up in the histogram (capacity runs read it to tell a
stalled loop from a starved detector)."""

from __future__ import annotations

import asyncio
import time

from server.metrics import EVENT_LOOP_LAG_MS, watch_event_loop


def _observed() -> tuple[float, float]:
    """(sum of lags ms, lags over 100 ms) so far."""
    samples = {s.name + s.labels.get("le", ""): s.value for s in EVENT_LOOP_LAG_MS.collect()[0].samples}
    return samples["vigil_event_loop_lag_ms_sum"], samples["vigil_event_loop_lag_ms_count"] - samples[
        "vigil_event_loop_lag_ms_bucket100.0"]


async def test_a_blocked_loop_is_observed_as_lag():
    before_sum, before_late = _observed()
    watcher = asyncio.create_task(watch_event_loop(period_s=0.01))
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # noqa: ASYNC251 - blocks the loop on purpose, as a model run on it would
    await asyncio.sleep(0.05)
    watcher.cancel()
    after_sum, after_late = _observed()
    assert after_sum - before_sum >= 250
    assert after_late - before_late >= 1
