"""``sessions``: limits of WebRTC sessions and server-side sources."""

from __future__ import annotations

from pydantic import Field

from server.config.base import Section


class SessionLimits(Section):
    max_sessions: int = Field(16, ge=1, description="Concurrent WebRTC sessions.")
    max_sources: int = Field(16, ge=1, description="Concurrent server-side sources.")
    metrics_interval_s: float = Field(1.0, gt=0, description="Period of per-session 'metrics' messages.")
    outbound_queue_messages: int = Field(
        1000, ge=10, description="Messages buffered per subscriber before a slow consumer is disconnected."
    )
    audio_queue_frames: int = Field(500, ge=10, description="Audio frames buffered per session (backpressure).")
