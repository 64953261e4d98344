"""Shared fixtures: a real Vigil server on loopback, test media made on the spot.

Network tests run inside a private network namespace (``make test`` wraps pytest in ``unshare -n``), so
nothing can leave the machine; ICE is limited to 127.0.0.1 through ``webrtc.host_addresses``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from models.llm.embedded import EmbeddedLlm
from server.app import create_app
from server.config import Settings, load_settings
from server.engines import Analyzers, ModelPool
from server.http.serve import start_serving
from server.media.sessions import SESSIONS
from server.media.sources import SOURCES
from tests.support.media import make_clip
from tests.support.redis_server import RedisServer

os.environ.setdefault("YOLO_OFFLINE", "1")
# Every server a test starts, in-process or as a `vigil serve` child (which inherits this), takes a free gRPC
# port: the default 50051 would collide between servers running at once.
os.environ.setdefault("VIGIL_GRPC__PORT", "0")


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("media")
    make_clip(root / "clip.mp4", seconds=2.0)
    make_clip(root / "long.mp4", seconds=6.0)
    return root


@pytest.fixture(scope="module")
def embedded_llm() -> Iterator[EmbeddedLlm]:
    """The packaged SmolLM2 in process (xllamacpp), loaded once per test module that asks for it, closed after it."""
    llm = EmbeddedLlm()
    yield llm
    asyncio.run(llm.close())


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh, empty ``redis-server`` on a loopback port for one test (``stop()`` then ``start()`` brings it back
    empty on the same port)."""
    with RedisServer(tmp_path) as server:
        yield server


@dataclass
class RunningServer:
    url: str
    app: web.Application
    settings: Settings
    runner: web.AppRunner | None = None

    async def stop(self) -> None:
        """Stop this server now, as a shutdown would (e.g. to start another on the same data)."""
        if self.runner is not None and self.runner.server is not None:
            await self.runner.cleanup()

    @property
    def sessions(self) -> Any:
        return self.app[SESSIONS]

    @property
    def sources(self) -> Any:
        return self.app[SOURCES]


ServerFactory = Callable[..., "asyncio.Future[RunningServer]"]


@pytest.fixture(scope="session")
def model_pool() -> Iterator[ModelPool]:
    """The loaded models every in-process server of the test session takes its weights from (each app still
    builds its own engines, LLM router and detector): handed to each app explicitly, so Whisper, Piper, the LLM
    and MiniLM load once per test session, as they load once per ``vigil serve``."""
    pool = ModelPool()
    yield pool
    asyncio.run(pool.close())


@pytest.fixture
async def vigil(clip_dir: Path, tmp_path: Path, model_pool: ModelPool) -> AsyncIterator[Callable[..., Any]]:
    """Start a real server: ``await vigil(**overrides)`` -> RunningServer; all are stopped afterwards."""
    runners: list[web.AppRunner] = []

    async def start(analyzers: Analyzers | None = None, **overrides: Any) -> RunningServer:
        base: dict[str, Any] = {
            "webrtc": {"host_addresses": ["127.0.0.1"]},
            "sources": {"media_root": str(clip_dir), "reconnect_initial_s": 0.2, "reconnect_max_s": 1.0},
            # Load admission off: here the clients share the server's event loop, so its load is theirs too
            # (tests/integration/test_admission.py turns it on).
            "sessions": {"metrics_interval_s": 0.5, "max_loop_load": None, "max_media_delay_s": None,
                         "max_starting_sessions": None},
            "models": {"detector": {"backend": "none"}},  # tests that need a detector ask for one
            "voice": {"enabled": False},  # ... and the voice loop
            "memory": {"enabled": False, "data_dir": str(tmp_path / "memory")},  # ... and memory
            "grpc": {"port": 0},  # any free port: tests may run several servers at once
            # each test its own data: never the checkout's data/ (tests/conftest.py checks)
            "storage": {"data_dir": str(tmp_path / "timeline")},
            "transcription": {"data_dir": str(tmp_path / "transcription")},
        }
        for section, values in overrides.items():
            if section == "models":
                for stage, stage_values in values.items():
                    base["models"].setdefault(stage, {}).update(stage_values)
            else:
                base.setdefault(section, {}).update(values)
        settings = load_settings(None, base)
        app = create_app(settings, analyzers, models=model_pool)
        runner = await start_serving(app, "127.0.0.1", 0, shutdown_timeout=2.0)  # as `vigil serve` serves
        runners.append(runner)
        port = runner.addresses[0][1]
        return RunningServer(f"http://127.0.0.1:{port}", app, settings, runner)

    yield start
    for runner in runners:
        if runner.server is not None:  # not stopped by the test already
            await runner.cleanup()
