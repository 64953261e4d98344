"""Model engines built from the config. ``Engines`` is the app's set: built once per app (the session models at
start-up, the rest on first use), handed to the sessions and sources, the chat service, the audio API and gRPC,
and closed with the app. Weights load once per process (``_shared``): several apps in one process (tests) share
them."""

from __future__ import annotations

import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from aiohttp import web

from models.batch_stt import BatchedWhisper
from models.detectors import load_detector
from models.embeddings import TextEmbedder
from models.llm import EmbeddedLlm, LanguageModel
from models.packaged import ModelNotAvailable
from models.router import RoutedLlm
from models.stt import WhisperStt
from models.tts import EspeakTts, PiperTts, TextToSpeech
from models.turn import SmartTurnV3
from models.vad import SileroVadModel
from pipelines.video.analyzer import DetectorVideoAnalyzer
from pipelines.video.batcher import InferenceBatcher
from pipelines.voice.loop import VoiceEngine, VoiceLoop, VoiceLoopConfig
from server import config_mapping
from server.config import Settings
from server.sessions import Analyzers

log = logging.getLogger(__name__)

_models: dict[tuple[Any, ...], Any] = {}
_models_lock = threading.Lock()


def _shared(key: tuple[Any, ...], load: Callable[[], Any]) -> Any:
    """Load a blocking model once per process (tests and several apps in one process share it)."""
    with _models_lock:
        if key not in _models:
            _models[key] = load()
        return _models[key]


def build_analyzers(settings: Settings) -> Analyzers:
    """Load the configured models (blocking, seconds); raises ModelNotAvailable with a how-to message."""
    analyzers = Analyzers()
    if settings.models.detector.backend != "none":
        batcher = build_batcher(settings)
        analyzers.video = lambda: DetectorVideoAnalyzer(batcher)
        analyzers.closers.append(batcher.close)
    if settings.voice.enabled:
        engine = build_voice_engine(settings)
        analyzers.audio = lambda origin: VoiceLoop(engine, voice_loop_config(settings, origin))
        analyzers.closers.append(engine.close)
    return analyzers


def build_batcher(settings: Settings) -> InferenceBatcher:
    detector = load_detector(settings.models.detector)
    if detector is None:
        raise ValueError("models.detector.backend is 'none': there is no detector to batch for")
    log.info("detector %s loaded on %s", detector.name, detector.device)
    return InferenceBatcher(detector, max_batch=settings.video.max_batch, max_wait_ms=settings.video.max_wait_ms,
                            nice=settings.video.inference_nice)


def build_llm(settings: Settings) -> LanguageModel:
    config = settings.models.llm
    if config.backend == "openai":
        if not config.base_url and not config.upstreams:
            raise ModelNotAvailable("models.llm.backend is 'openai' but neither models.llm.base_url nor "
                                    "models.llm.upstreams is set")
        return _shared_router(settings)
    return _shared(("llm", config.model_path), lambda: EmbeddedLlm(config.model_path))


_routers: dict[int, RoutedLlm] = {}


def _shared_router(settings: Settings) -> RoutedLlm:
    """One router per Settings object, i.e. per app and event loop (it holds HTTP sessions and a health-check
    task): the voice loop, the chat API and gRPC share its in-flight counts, latency averages and health state.
    The app closes it on cleanup (``close_shared_llm``)."""
    key = id(settings)
    with _models_lock:
        if key not in _routers:
            _routers[key] = build_router(settings)
            weakref.finalize(settings, _routers.pop, key, None)
        return _routers[key]


async def close_shared_llm(settings: Settings) -> None:
    """Close the app's router once, when the app is done with it (the voice loop, the chat API and gRPC only use
    it). The embedded model is process-wide and stays loaded."""
    with _models_lock:
        router = _routers.pop(id(settings), None)
    if router is not None:
        await router.close()


def build_router(settings: Settings) -> RoutedLlm:
    """The openai backend: every configured upstream behind one router; a plain base_url is one upstream that
    serves any model name (as before routing existed)."""
    config = settings.models.llm
    return RoutedLlm(config_mapping.upstream_configs(config), config.model,
                     config_mapping.routing_config(config.routing))


def build_stt(settings: Settings) -> WhisperStt:
    stt = settings.models.stt
    return _shared(("stt", stt.model_dir, stt.device, stt.compute_type, stt.short_window),
                   lambda: WhisperStt(stt.model_dir, device=stt.device, compute_type=stt.compute_type,
                                      short_window=stt.short_window))


def build_batch_stt(settings: Settings) -> BatchedWhisper:
    """The batch transcription model: its own instance (apart from the live one), once per process and config;
    one CTranslate2 worker per job thread plus one for direct requests."""
    config, stt = settings.transcription, settings.models.stt
    model_dir = config.model_dir or stt.model_dir
    return _shared(("batch-stt", model_dir, stt.device, stt.compute_type, config.cpu_threads, config.workers),
                   lambda: BatchedWhisper(model_dir, device=stt.device, compute_type=stt.compute_type,
                                          cpu_threads=config.cpu_threads, num_workers=config.workers + 1))


def build_tts(settings: Settings) -> TextToSpeech:
    config = settings.models.tts
    if config.backend == "espeak":
        return EspeakTts(config.voice or "en-us")
    return _shared(("piper", config.voice), lambda: PiperTts(config.voice))


def build_voice_engine(settings: Settings) -> VoiceEngine:
    engine = VoiceEngine(
        vad=_shared(("vad",), SileroVadModel),
        stt=build_stt(settings),
        llm=build_llm(settings),
        tts=build_tts(settings),
        turn=_shared(("smart-turn",), SmartTurnV3) if settings.voice.turn_detection == "smart-turn" else None,
    )
    log.info("voice loop models: %s", engine.names)
    return engine


class Engines:
    """The app's models. ``analyzers`` (detector batcher, voice loop) are built at start-up, because every session
    needs them; the others (chat LLM and embedder, gRPC's STT, batch STT, TTS) when first asked for, on the
    caller's thread (call them from a worker thread: they block while loading)."""

    def __init__(self, settings: Settings, analyzers: Analyzers | None = None) -> None:
        self.settings = settings
        self.analyzers = analyzers if analyzers is not None else build_analyzers(settings)
        self._lock = threading.Lock()
        self._built: dict[str, Any] = {}

    def _once(self, name: str, build: Callable[[], Any]) -> Any:
        with self._lock:
            if name not in self._built:
                self._built[name] = build()
            return self._built[name]

    def llm(self) -> LanguageModel:
        return self._once("llm", lambda: build_llm(self.settings))

    def embedder(self) -> TextEmbedder:
        return self._once("embedder", lambda: build_embedder(self.settings))

    def stt(self) -> WhisperStt:
        return self._once("stt", lambda: build_stt(self.settings))

    def batch_stt(self) -> BatchedWhisper:
        return self._once("batch_stt", lambda: build_batch_stt(self.settings))

    def tts(self) -> TextToSpeech:
        return self._once("tts", lambda: build_tts(self.settings))

    def loaded(self, name: str) -> bool:
        return name in self._built

    async def close_session_models(self) -> None:
        """On shutdown, once the sessions are closed."""
        await self.analyzers.close()

    async def close(self) -> None:
        """On cleanup, after every handler has finished (a chat stream may still use the router at shutdown)."""
        await close_shared_llm(self.settings)


ENGINES = web.AppKey("engines", Engines)


def voice_loop_config(settings: Settings, origin: str) -> VoiceLoopConfig:
    """One session's voice loop config (``server.config_mapping.voice_loop_config`` on ``settings.voice``)."""
    return config_mapping.voice_loop_config(settings.voice, origin)


def build_embedder(settings: Settings) -> TextEmbedder:
    """The sentence embedder of the chat API's semantic cache (loaded once per process)."""
    from models.embeddings import MiniLmEmbedder  # deferred: imports torch

    return _shared(("embedder",), MiniLmEmbedder)
