"""Model engines built from the config: loaded once per process, shared by every session and source."""

from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from collections.abc import Callable
from typing import Any

from pydantic import SecretStr

from models.batch_stt import BatchedWhisper
from models.detectors import load_detector
from models.embeddings import TextEmbedder
from models.llm import EmbeddedLlm, LanguageModel
from models.packaged import ModelNotAvailable
from models.router import ANY_MODEL, RoutedLlm, RoutingConfig, UpstreamConfig
from models.stt import WhisperStt
from models.tts import EspeakTts, PiperTts, TextToSpeech
from models.turn import SmartTurnV3
from models.vad import SileroVadModel
from pipelines.video.analyzer import DetectorVideoAnalyzer
from pipelines.video.batcher import InferenceBatcher
from pipelines.voice.loop import VoiceEngine, VoiceLoop, VoiceLoopConfig
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
    detector_config = settings.models.detector
    detector = load_detector(
        detector_config.backend,
        weights=detector_config.weights,
        device=detector_config.device,
        imgsz=detector_config.imgsz,
        conf=detector_config.conf,
        half=detector_config.half,
        classes=detector_config.classes,
    )
    log.info("detector %s loaded on %s", detector.name, detector.device)
    return InferenceBatcher(detector, max_batch=settings.video.max_batch, max_wait_ms=settings.video.max_wait_ms)


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

    def secret(value: SecretStr | None) -> str | None:
        return value.get_secret_value() if value else None

    upstreams = [UpstreamConfig(u.name, u.base_url, tuple(u.models), secret(u.api_key), u.cost, u.context_window)
                 for u in config.upstreams]
    if config.base_url:
        upstreams.insert(0, UpstreamConfig("default", config.base_url, (ANY_MODEL,), secret(config.api_key)))
    return RoutedLlm(upstreams, config.model, RoutingConfig(**config.routing.model_dump()))


def build_stt(settings: Settings) -> WhisperStt:
    stt = settings.models.stt
    return _shared(("stt", stt.model_dir, stt.device, stt.compute_type),
                   lambda: WhisperStt(stt.model_dir, device=stt.device, compute_type=stt.compute_type))


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


def voice_loop_config(settings: Settings, origin: str) -> VoiceLoopConfig:
    voice = settings.voice
    echo_gating = voice.echo_gating == "on" or (voice.echo_gating == "auto" and origin in ("rtsp", "file"))
    shared = {f.name for f in dataclasses.fields(VoiceLoopConfig)} - {"echo_gating"}
    return VoiceLoopConfig(echo_gating=echo_gating, **voice.model_dump(include=shared))


def build_embedder(settings: Settings) -> TextEmbedder:
    """The sentence embedder of the chat API's semantic cache (loaded once per process)."""
    from models.embeddings import MiniLmEmbedder  # deferred: imports torch

    return _shared(("embedder",), MiniLmEmbedder)
