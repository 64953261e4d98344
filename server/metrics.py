"""Server-level Prometheus metrics (pipeline metrics live in ``pipelines.telemetry``)."""

from __future__ import annotations

import asyncio

from prometheus_client import Counter, Gauge, Histogram

SESSIONS = Gauge("vigil_sessions", "Open WebRTC sessions.")
SOURCES = Gauge("vigil_sources", "Running server-side sources.")
SOURCE_STATES = Counter("vigil_source_state_changes_total", "Source state changes.", ["state"])
HTTP_ERRORS = Counter("vigil_http_errors_total", "HTTP error responses by status and code.", ["status", "code"])
MQTT_CONNECTED = Gauge("vigil_mqtt_connected", "1 while the MQTT publisher is connected to its broker.")
MQTT_QUEUED = Gauge("vigil_mqtt_queued_messages", "Events and snapshots waiting for the MQTT broker.")
MQTT_PUBLISHED = Counter("vigil_mqtt_published_total", "MQTT messages the broker acknowledged, by kind "
                         "(event, snapshot, state: counts, discovery).", ["kind"])
MQTT_DROPPED = Counter("vigil_mqtt_dropped_total", "MQTT messages dropped because the queue was full "
                       "(mqtt.queue_messages) while the broker was away, by kind.", ["kind"])

EVENT_LOOP_LAG_MS = Histogram(
    "vigil_event_loop_lag_ms", "How late the event loop woke a 50 ms timer, ms (a blocked loop delays all media).",
    buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000),
)


async def watch_event_loop(period_s: float = 0.05) -> None:
    """Runs for the app's lifetime: observes the loop's lag into ``vigil_event_loop_lag_ms``."""
    loop = asyncio.get_running_loop()
    while True:
        started = loop.time()
        await asyncio.sleep(period_s)
        EVENT_LOOP_LAG_MS.observe(max(0.0, loop.time() - started - period_s) * 1000.0)
