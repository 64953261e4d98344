"""Server-level Prometheus metrics (pipeline metrics live in ``pipelines.telemetry``)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

SESSIONS = Gauge("vigil_sessions", "Open WebRTC sessions.")
SOURCES = Gauge("vigil_sources", "Running server-side sources.")
SOURCE_STATES = Counter("vigil_source_state_changes_total", "Source state changes.", ["state"])
HTTP_ERRORS = Counter("vigil_http_errors_total", "HTTP error responses by status and code.", ["status", "code"])
