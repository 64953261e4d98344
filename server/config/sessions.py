"""``sessions``: limits of WebRTC sessions and server-side sources."""

from __future__ import annotations

from pydantic import Field

from server.config.base import Section


class SessionLimits(Section):
    max_sessions: int = Field(16, ge=1, description="Concurrent WebRTC sessions.")
    max_loop_load: float | None = Field(
        0.7, gt=0, le=1,
        description="Refuse new WebRTC sessions (503 + Retry-After) when the event-loop thread, which reads every "
                    "session's media, would pass this share of one core: measured load + the measured cost of the "
                    "sessions still starting and of one more. Past ~0.9 its reads fall behind and ICE consent "
                    "expires for every session at once. null: no load admission.")
    max_media_delay_s: float | None = Field(
        1.0, gt=0, description="Refuse new WebRTC sessions (503 + Retry-After) while any live session's media "
                               "reaches its pipeline this many seconds behind its own timestamps (it is not keeping "
                               "up). null: off.")
    max_starting_sessions: int | None = Field(
        4, ge=1, description="At most this many WebRTC sessions may be starting (answered less than ~5 s ago, "
                             "before their load and lateness show); more offers get 503 + Retry-After. null: off.")
    busy_retry_after_s: float = Field(10.0, gt=0, description="Retry-After of an offer refused for load.")
    max_sources: int = Field(16, ge=1, description="Concurrent server-side sources.")
    metrics_interval_s: float = Field(1.0, gt=0, description="Period of per-session 'metrics' messages.")
    outbound_queue_messages: int = Field(
        1000, ge=10, description="Messages buffered per subscriber before a slow consumer is disconnected."
    )
    audio_queue_frames: int = Field(500, ge=10, description="Audio frames buffered per session (backpressure).")
