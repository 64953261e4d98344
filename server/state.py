"""Every typed key of what the aiohttp application holds, in one place. ``server.app`` sets them once, from the
``Services`` that ``server.services.build_services`` built; handlers only read them."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from pipelines.memory.index import MemoryIndex
from pipelines.timeline.store import TimelineStore
from server.config import Settings
from server.engines import Engines
from server.grpc_api.service import GrpcServer
from server.media.sessions import SessionRegistry
from server.media.sources import SourceManager
from server.v1.audio_services import AudioServices
from server.v1.chat_service import ChatService
from server.v1.disconnects import DisconnectWatcher
from server.v1.ingress import V1Ingress


@dataclass
class StartUp:
    """Whether the app's start-up steps have all run (the readiness probe's first condition)."""

    done: bool = False


SETTINGS = web.AppKey("settings", Settings)
ENGINES = web.AppKey("engines", Engines)
SESSIONS = web.AppKey("sessions", SessionRegistry)
SOURCES = web.AppKey("sources", SourceManager)
WEBSOCKETS = web.AppKey("websockets", set[web.WebSocketResponse])
REDIS = web.AppKey("redis", object)  # only with redis.url
V1_INGRESS = web.AppKey("v1_ingress", V1Ingress)
CHAT_SERVICE = web.AppKey("chat_service", ChatService)
DISCONNECTS = web.AppKey("chat_disconnects", DisconnectWatcher)
AUDIO = web.AppKey("audio", AudioServices)  # only with transcription or speech enabled
TIMELINE = web.AppKey("timeline", TimelineStore)  # only with storage.enabled
MEMORY = web.AppKey("memory", MemoryIndex)  # only with memory.enabled
MEMORY_CATCH_UP = web.AppKey("memory_catch_up", asyncio.Task)  # indexing what the last run missed (start-up)
# A name, not the class: server.cluster imports these keys (its handlers), so this module cannot import it back.
CLUSTER = web.AppKey("cluster", "ClusterNode")  # only with cluster.redis_url
GRPC_SERVER = web.AppKey("grpc_server", GrpcServer)  # only with grpc.enabled
STARTUP = web.AppKey("probes_startup", StartUp)
