"""``server``: the HTTP listener and the dashboard files."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from server.config.base import REPO_ROOT, Section


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest accepted HTTP request body.")
    web_root: Path = Field(REPO_ROOT / "web", description="Directory the dashboard is served from.")
    shutdown_timeout_s: float = Field(5.0, gt=0)
    event_loop: Literal["uvloop", "asyncio"] = Field(
        "uvloop", description="The event loop `vigil serve` runs on: uvloop reads every session's media with far "
                              "less overhead per datagram than asyncio's selector loop (bench/survival.py).")
    header_timeout_s: float | None = Field(
        10.0, gt=0, le=3600,
        description="How long a connection may take to send a request's headers, from its first byte (or from the "
                    "connection itself, for its first request); then it gets 408 and is closed. Bounds slow-header "
                    "(slowloris) clients. null: no limit.")
    body_timeout_s: float | None = Field(
        30.0, gt=0, le=86400,
        description="How long a request's body may take to arrive once its headers have, plus one second per "
                    "body_min_rate_bytes_s bytes received (a large upload at a steady rate is never cut): past it the "
                    "handler reading the body answers 408 request_timeout and the connection is closed (a body sent "
                    "at 1 byte/s held its connection for ever). null: no limit.")
    body_min_rate_bytes_s: int = Field(
        1000, ge=0, le=10**9,
        description="The slowest average rate (bytes/s) a request body may arrive at once body_timeout_s has passed "
                    "(0: body_timeout_s bounds the whole body).")
    max_connections_per_address: int | None = Field(
        128, ge=1, le=100_000,
        description="Open connections from one client address at most (WebSockets included); one more is answered "
                    "429 too_many_connections (Retry-After) and closed. Clients behind one NAT share an address. "
                    "null: no limit.")
    malloc_arena_max: int = Field(
        2, ge=0, le=1024,
        description="glibc malloc arenas `vigil serve` may use (0: glibc's default, 8 per core). Freed memory stays "
                    "in the arena of the thread that used it; with few arenas the next session reuses it, so RSS "
                    "stays flat over many sessions (bench/soak.py). MALLOC_ARENA_MAX in the environment wins.")
