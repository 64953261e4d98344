"""Model engines built from the config: loaded once per process, shared by every session and source."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from typing import Any

from models.detectors import load_detector
from models.embeddings import TextEmbedder
from models.llm import EmbeddedLlm, LanguageModel, OpenAiLlm
from models.packaged import ModelNotAvailable
from models.stt import WhisperStt
from models.tts import EspeakTts, PiperTts, TextToSpeech
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
        if not config.base_url:
            raise ModelNotAvailable("models.llm.backend is 'openai' but models.llm.base_url is not set")
        api_key = config.api_key.get_secret_value() if config.api_key else None
        return OpenAiLlm(config.base_url, config.model, api_key=api_key)  # per app: it holds an HTTP session
    return _shared(("llm", config.model_path), lambda: EmbeddedLlm(config.model_path))


def build_tts(settings: Settings) -> TextToSpeech:
    config = settings.models.tts
    if config.backend == "espeak":
        return EspeakTts(config.voice or "en-us")
    return _shared(("piper", config.voice), lambda: PiperTts(config.voice))


def build_voice_engine(settings: Settings) -> VoiceEngine:
    stt = settings.models.stt
    engine = VoiceEngine(
        vad=_shared(("vad",), SileroVadModel),
        stt=_shared(("stt", stt.model_dir, stt.device, stt.compute_type),
                    lambda: WhisperStt(stt.model_dir, device=stt.device, compute_type=stt.compute_type)),
        llm=build_llm(settings),
        tts=build_tts(settings),
        owns_llm=settings.models.llm.backend == "openai",
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
