"""Probes for orchestrators, answered without a token: ``/healthz`` (liveness: the process serves HTTP; alias
``/livez``) and ``/readyz`` (the configured models are loaded and start-up is over: 200, else 503). Without the
token they say only that; with it, ``/healthz`` adds the version and the session and source counts and
``/readyz`` which model is in which state."""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Literal

from aiohttp import web
from pydantic import BaseModel, Field

from server import __version__
from server.http.auth import presented_token
from server.media.sessions import SESSIONS
from server.media.sources import SOURCES
from server.state import MEMORY, SETTINGS
from server.v1.audio_services import AUDIO
from server.v1.chat_service import CHAT_SERVICE

ModelState = Literal["loaded", "on_first_use", "off"]


@dataclass
class StartUp:
    """Whether the app's start-up steps have all run (the readiness probe's first condition)."""

    done: bool = False


STARTUP = web.AppKey("probes_startup", StartUp)


class Liveness(BaseModel):
    status: Literal["ok"] = "ok"


class Health(BaseModel):
    """Liveness; the details only with the token (or on a server without one)."""

    status: Literal["ok"] = "ok"
    version: str | None = None
    sessions: int | None = None
    sources: int | None = None


class Readiness(BaseModel):
    status: Literal["ready", "starting"]
    models: dict[str, ModelState] | None = Field(
        None, description="Only with the token: detector, voice, chat, transcription, speech, memory.")


def model_states(app: web.Application) -> dict[str, ModelState]:
    """Which configured model is loaded: loaded at start-up (detector, voice loop; chat with api.preload; the
    memory's embedder when the timeline feeds it), loaded on first use (the rest, until a request loads it), or
    off."""
    settings, analyzers = app[SETTINGS], app[SESSIONS].analyzers
    chat = app.get(CHAT_SERVICE)
    audio = app.get(AUDIO)
    memory = app.get(MEMORY)

    def lazy(enabled: bool, loaded: bool) -> ModelState:
        return "off" if not enabled else "loaded" if loaded else "on_first_use"

    return {
        "detector": "loaded" if analyzers.video is not None else "off",
        "voice": "loaded" if analyzers.audio is not None else "off",
        "chat": lazy(settings.api.chat, chat is not None and chat.pipeline_if_loaded is not None),
        "transcription": lazy(settings.transcription.enabled, audio is not None and audio.engine.loaded),
        "speech": lazy(settings.speech.enabled, audio is not None and audio.speech_loaded),
        "memory": lazy(settings.memory.enabled, memory is not None and memory.opened),
    }


def is_ready(app: web.Application, states: dict[str, ModelState]) -> bool:
    """Start-up is over (models built, gRPC listening, jobs resumed) and what must be preloaded is."""
    preload_missing = app[SETTINGS].api.preload and states["chat"] == "on_first_use"
    startup = app.get(STARTUP)
    return startup is not None and startup.done and not preload_missing


def has_valid_token(request: web.Request) -> bool:
    token = request.app[SETTINGS].auth.token
    given = presented_token(request)
    if token is None:
        return True  # an open server shows everything anyway
    return given is not None and hmac.compare_digest(given.encode(), token.get_secret_value().encode())


async def healthz(request: web.Request) -> web.Response:
    if not has_valid_token(request):  # a liveness probe holds no secret, and learns nothing more
        return web.json_response(text=Health().model_dump_json(exclude_none=True))
    health = Health(version=__version__, sessions=len(request.app[SESSIONS]), sources=len(request.app[SOURCES]))
    return web.json_response(text=health.model_dump_json())


async def livez(request: web.Request) -> web.Response:
    return web.json_response(text=Liveness().model_dump_json())


async def readyz(request: web.Request) -> web.Response:
    states = model_states(request.app)
    ready = is_ready(request.app, states)
    body = Readiness(status="ready" if ready else "starting", models=states if has_valid_token(request) else None)
    return web.json_response(text=body.model_dump_json(exclude_none=True), status=200 if ready else 503)


def mount_probes(app: web.Application) -> None:
    """Call last in the app's set-up: readiness begins when every earlier start-up step has run."""

    startup = app[STARTUP] = StartUp()

    async def started(app: web.Application) -> None:
        startup.done = True

    app.on_startup.append(started)
