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
    malloc_arena_max: int = Field(
        2, ge=0, le=1024,
        description="glibc malloc arenas `vigil serve` may use (0: glibc's default, 8 per core). Freed memory stays "
                    "in the arena of the thread that used it; with few arenas the next session reuses it, so RSS "
                    "stays flat over many sessions (bench/soak.py). MALLOC_ARENA_MAX in the environment wins.")
