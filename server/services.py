"""One wiring: every service of an app built once, in dependency order, by ``build_services``; the front-ends get
what they use from the ``Services`` it returns (``server.app`` mounts them). Nothing is handed over by setting an
attribute on another service afterwards: what a service needs is an argument of its constructor."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from pipelines.memory.index import MemoryIndex
from pipelines.voice.recall import ContextProvider
from server.cluster.node import ClusterNode
from server.config import Settings
from server.engines import Engines, ModelPool, VoiceLoops
from server.grpc_api.service import GrpcServer, build_grpc
from server.media.sessions import Analyzers, SessionRegistry
from server.media.sources import SourceManager
from server.store.events import Timeline, build_timeline
from server.store.memory import build_memory, document_retriever, voice_recall
from server.v1.audio import build_audio
from server.v1.audio_services import AudioServices
from server.v1.chat_service import ChatService
from server.v1.disconnects import DisconnectWatcher
from server.v1.ingress import V1Ingress
from server.v1.shared_redis import open_redis


@dataclass(frozen=True)
class Services:
    settings: Settings
    engines: Engines  # the models (session models loaded by build_services; the rest on first use)
    analyzers: Analyzers  # what each new session's and source's pipeline gets (with memory's voice recall)
    redis: Any  # the shared Redis client (redis.url), or None
    timeline: Timeline  # the events store and the recorder factory
    memory: MemoryIndex | None  # memory.enabled
    sessions: SessionRegistry
    sources: SourceManager
    chat: ChatService  # /v1/chat/completions and gRPC Predict
    disconnects: DisconnectWatcher  # the chat handlers' client-gone watcher
    ingress: V1Ingress  # every /v1 route: keys, rate limits, sizes
    audio: AudioServices | None  # transcription or speech enabled
    cluster: ClusterNode | None  # cluster.redis_url
    grpc: GrpcServer | None  # grpc.enabled


def build_services(settings: Settings, analyzers: Analyzers | None = None,
                   models: ModelPool | None = None) -> Services:
    """``analyzers`` defaults to the models the config names (loaded here, once: seconds). ``models``: loaded
    weights to take from (and add to) instead of the app's own pool; its owner closes it."""
    engines = Engines(settings, analyzers, models)
    redis = open_redis(settings)
    timeline = build_timeline(settings)
    memory = build_memory(settings, engines)
    session_analyzers = with_voice_recall(engines.analyzers, voice_recall(settings, memory))
    sessions = SessionRegistry(settings, session_analyzers, timeline.recorders)
    sources = SourceManager(settings, session_analyzers, timeline.recorders)
    chat = ChatService(settings, engines, redis, document_retriever(settings, memory))
    cluster = ClusterNode(settings, sessions, sources) if settings.cluster.redis_url is not None else None
    return Services(
        settings=settings, engines=engines, analyzers=session_analyzers, redis=redis, timeline=timeline,
        memory=memory, sessions=sessions, sources=sources, chat=chat,
        disconnects=DisconnectWatcher(settings.api.disconnect_poll_s), ingress=V1Ingress(settings, redis),
        audio=build_audio(settings, engines), cluster=cluster, grpc=build_grpc(settings, engines, chat),
    )


def with_voice_recall(analyzers: Analyzers, recall: ContextProvider | None) -> Analyzers:
    """The session analysers: with voice recall, new ones whose voice loops are built with the memory as their
    ``recall``; else the engines' own. The engines' stay as they were built (gRPC conversations use them)."""
    if recall is None or not isinstance(analyzers.audio, VoiceLoops):
        return analyzers
    return dataclasses.replace(analyzers, audio=analyzers.audio.with_recall(recall))
