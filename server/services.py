"""One wiring: every service of an app built once, in dependency order, by ``build_services``; the front-ends get
what they use from the ``Services`` it returns (``server.app`` mounts them). Nothing is handed over by setting an
attribute on another service afterwards: what a service needs is an argument of its constructor. Here too: how the
timeline store, its recorders and the memory index are built from the config, and the memory's start-up and
shutdown, so that the packages of HTTP handlers (``server.records``) hold handlers only."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from models.embeddings import TextEmbedder
from pipelines.memory.feed import TimelineFeed
from pipelines.memory.index import MemoryIndex, VectorIndex
from pipelines.memory.lance_vectors import LanceVectors
from pipelines.memory.recall import MemoryRecall
from pipelines.memory.vectors import MilvusVectors
from pipelines.timeline.alerts import AlertSwitch
from pipelines.timeline.recorder import AppearRule, RecorderSettings, TimelineRecorder
from pipelines.timeline.store import TimelineStore
from pipelines.voice.recall import ContextProvider
from server import __version__
from server.cluster.node import ClusterNode
from server.config import Settings
from server.engines import Analyzers, Engines, ModelPool, VoiceLoops
from server.grpc_api.service import GrpcServer, build_grpc
from server.mcp_api.service import McpService
from server.mcp_api.tools import VigilTools
from server.media.sessions import SessionRegistry, TimelineFactory
from server.media.sources import SourceManager
from server.mqtt.commands import MqttCommands
from server.mqtt.publisher import MqttPublisher
from server.mqtt.switches import SwitchStore
from server.records.memory import chat_documents
from server.state import MEMORY_CATCH_UP
from server.v1.audio import build_audio
from server.v1.audio_services import AudioServices
from server.v1.chat_service import ChatService, DocumentRetriever
from server.v1.disconnects import DisconnectWatcher
from server.v1.ingress import V1Ingress
from server.v1.shared_redis import open_redis

log = logging.getLogger(__name__)


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
    mqtt: MqttPublisher | None  # mqtt.enabled
    mcp: McpService | None  # mcp.enabled


def build_services(settings: Settings, analyzers: Analyzers | None = None,
                   models: ModelPool | None = None) -> Services:
    """``analyzers`` defaults to the models the config names (loaded here, once: seconds). ``models``: loaded
    weights to take from (and add to) instead of the app's own pool; its owner closes it."""
    engines = Engines(settings, analyzers, models)
    redis = open_redis(settings)
    # The switches MQTT's commands flip, kept in the data dir (only MQTT flips them: without it, all start on).
    switches = SwitchStore(settings.storage.data_dir) if settings.mqtt.enabled else None
    timeline = build_timeline(settings, switches)
    memory = build_memory(settings, engines)
    session_analyzers = with_voice_recall(engines.analyzers, voice_recall(settings, memory))
    sessions = SessionRegistry(settings, session_analyzers, timeline.recorders)
    sources = SourceManager(settings, session_analyzers, timeline.recorders, switches)
    chat = ChatService(settings, engines, redis, document_retriever(settings, memory))
    cluster = ClusterNode(settings, sessions, sources) if settings.cluster.redis_url is not None else None
    return Services(
        settings=settings, engines=engines, analyzers=session_analyzers, redis=redis, timeline=timeline,
        memory=memory, sessions=sessions, sources=sources, chat=chat,
        disconnects=DisconnectWatcher(settings.api.disconnect_poll_s), ingress=V1Ingress(settings, redis),
        audio=build_audio(settings, engines), cluster=cluster, grpc=build_grpc(settings, engines, chat),
        mqtt=build_mqtt(settings, sources, sessions, timeline.alerts, switches),
        mcp=build_mcp(settings, engines, timeline, memory, sources),
    )


def build_mqtt(settings: Settings, sources: SourceManager, sessions: SessionRegistry,
               alerts: AlertSwitch, switches: SwitchStore | None = None) -> MqttPublisher | None:
    """The MQTT publisher and the commands it takes (``mqtt.enabled``); the composition root starts it with the
    stored timeline."""
    if not settings.mqtt.enabled:
        return None
    storage = settings.storage
    commands = MqttCommands(settings.mqtt, sources, sessions, alerts, switches)
    return MqttPublisher(settings.mqtt, snapshots_recorded=storage.enabled and storage.clips, commands=commands)


def build_mcp(settings: Settings, engines: Engines, timeline: Timeline, memory: MemoryIndex | None,
              sources: SourceManager) -> McpService | None:
    """The MCP server (``mcp.enabled``): its tools read the stored timeline, memory, sources and faces."""
    if not settings.mcp.enabled:
        return None
    tools = VigilTools(settings, engines, timeline.store if timeline.stored else None, memory, sources)
    return McpService(tools, __version__)


def with_voice_recall(analyzers: Analyzers, recall: ContextProvider | None) -> Analyzers:
    """The session analysers: with voice recall, new ones whose voice loops are built with the memory as their
    ``recall``; else the engines' own. The engines' stay as they were built (gRPC conversations use them)."""
    if recall is None or not isinstance(analyzers.audio, VoiceLoops):
        return analyzers
    return dataclasses.replace(analyzers, audio=analyzers.audio.with_recall(recall))


# ---------------------------------------------------------------- the timeline


def open_timeline(settings: Settings) -> TimelineStore:
    """The store the config describes, opened (blocking). When the data dir is unusable it stays closed and
    sessions run live-only (each reports it once)."""
    config = settings.storage
    store = TimelineStore(config.data_dir, max_age_s=config.retention_days * 86400, quota_bytes=config.quota_bytes,
                          queue_entries=config.queue_entries, batch_entries=config.batch_entries,
                          retention_interval_s=config.retention_interval_s)
    store.open()
    return store


def recorder_factory(settings: Settings, store: TimelineStore, executor: ThreadPoolExecutor,
                     alerts: AlertSwitch | None = None) -> TimelineFactory:
    config = settings.storage
    recorder_settings = RecorderSettings(
        clips=config.clips and config.enabled, pre_s=config.pre_s, post_s=config.post_s, max_s=config.max_s,
        clip_fps=config.clip_fps, scene_interval_s=config.scene_interval_s, quota_bytes=config.quota_bytes,
        appear=tuple(AppearRule(rule.label, rule.min_conf) for rule in config.appear),
    )

    def make(origin: str, name: str | None) -> TimelineRecorder:
        mode = "packets" if origin in ("rtsp", "file") else "frames"
        return TimelineRecorder(store, recorder_settings, executor, mode=mode, source_name=name, alerts=alerts)

    return make


@dataclass
class Timeline:
    """The timeline service: the store (opened with ``storage.enabled``; otherwise never opened, and recorders
    still raise 'object appeared' events and alerts) and the recorder factory every session and source gets."""

    store: TimelineStore
    stored: bool
    recorders: TimelineFactory
    executor: ThreadPoolExecutor
    alerts: AlertSwitch  # alerts on or off for every session (MQTT's alerts/set)

    async def close(self) -> None:
        # After sessions and sources closed (on_shutdown): their last clips are written by now.
        await asyncio.to_thread(self.executor.shutdown, True)
        await asyncio.to_thread(self.store.close)


def build_timeline(settings: Settings, switches: SwitchStore | None = None) -> Timeline:
    executor = ThreadPoolExecutor(2, thread_name_prefix="vigil-clips")
    if settings.storage.enabled:
        store = open_timeline(settings)
    else:  # never opened: nothing is stored, but recorders still raise 'object appeared' events and alerts
        store = TimelineStore(settings.storage.data_dir, max_age_s=0, quota_bytes=0)
    alerts = AlertSwitch(switches is None or switches.alerts is not False)  # as last switched, else on
    return Timeline(store, settings.storage.enabled, recorder_factory(settings, store, executor, alerts), executor,
                    alerts)


# ---------------------------------------------------------------- memory


def build_index(settings: Settings, embedder: Callable[[], TextEmbedder]) -> MemoryIndex:
    """``embedder``: the app's MiniLM (``Engines.embedder``, loaded on first use and shared with the chat cache)."""
    config = settings.memory
    return MemoryIndex(
        config.data_dir,
        embedder=embedder,
        vectors=lambda dimension: open_vectors(settings, dimension),
        queue_max=config.queue_max, batch_max=config.batch_max, candidates=config.candidates, rrf_k=config.rrf_k,
        search_workers=config.search_workers, search_queue_max=config.search_queue_max,
        search_retry_after_s=config.search_retry_after_s,
    )


def open_vectors(settings: Settings, dimension: int) -> VectorIndex:
    """The vector index: LanceDB embedded in ``data_dir`` (the default), or a Milvus server at ``memory.uri``."""
    config = settings.memory
    if config.uri is None:
        return LanceVectors(config.data_dir / "vectors.lance", config.collection, dimension)
    token = config.token.get_secret_value() if config.token else None
    return MilvusVectors(config.uri, config.collection, dimension, token=token)


def build_memory(settings: Settings, engines: Engines) -> MemoryIndex | None:
    """The app's memory index (``memory.enabled``), embedding with the app's MiniLM."""
    return build_index(settings, engines.embedder) if settings.memory.enabled else None


def voice_recall(settings: Settings, index: MemoryIndex | None) -> MemoryRecall | None:
    """What voice loops ask the memory before each answer (``memory.voice``), when memory is on; ``build_services``
    builds the session voice loops with it."""
    config = settings.memory.voice
    if index is None or not config.enabled:
        return None
    return MemoryRecall(index, max_entries=config.max_entries, max_tokens=config.max_tokens,
                        timeout_s=config.timeout_s)


def document_retriever(settings: Settings, index: MemoryIndex | None) -> DocumentRetriever | None:
    """What the chat service asks for a request's documents (``collection``), when memory is on."""
    if index is None:
        return None
    return lambda raw, chat: chat_documents(index, settings, raw, chat)


def mount_memory(app: web.Application, settings: Settings, index: MemoryIndex | None,
                 timeline: TimelineStore | None) -> None:
    """With memory enabled, the index fed by the timeline (``timeline``: the stored one, None with storage off)
    from start-up, and closed on cleanup. (Its routes are in the table always: disabled, they answer 503.)"""
    if index is None:
        return
    config = settings.memory

    async def start(app: web.Application) -> None:
        index.start()
        store = timeline
        if store is None or not store.available:
            why = "storage.enabled is false" if store is None else store.open_error
            log.warning("memory: %s, so nothing sessions and sources see or hear is recorded to index; "
                        "/api/search still searches documents", why)
            return
        # Loaded now, as the session models are: on first use it costs seconds of CPU inside a live session. A
        # failure here must not stop the server (memory is an extra): the first entry tries again, as before.
        try:
            await index.open()
        except Exception:
            log.exception("memory: cannot open the index at start-up; the first entry to index tries again")
        feed = TimelineFeed(index.add, asyncio.get_running_loop(), event_names=config.event_names)
        store.add_listener(feed)
        store.add_delete_listener(index.forget_events)  # a deleted or expired timeline entry leaves memory too
        # What the timeline committed but memory never indexed (the last run died with entries queued): in the
        # background, after the live feed is listening (both are idempotent), so start-up does not wait for it.
        catch_up = asyncio.create_task(index.catch_up(store.entries_after, feed.backlog), name="memory:catch-up")
        app[MEMORY_CATCH_UP] = catch_up
        catch_up.add_done_callback(_log_catch_up_failure)

    async def stop_catching_up(app: web.Application) -> None:
        # On shutdown, before any cleanup: the catch-up reads the timeline store, which cleanup closes.
        catch_up = app.get(MEMORY_CATCH_UP)
        if catch_up is not None and not catch_up.done():
            catch_up.cancel()
            await asyncio.gather(catch_up, return_exceptions=True)

    async def close(app: web.Application) -> None:
        await stop_catching_up(app)
        await index.close()

    app.on_startup.append(start)
    app.on_shutdown.append(stop_catching_up)
    app.on_cleanup.append(close)


def _log_catch_up_failure(task: asyncio.Task[int]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("memory: catching up with the timeline failed (the next start tries again)",
                  exc_info=task.exception())
