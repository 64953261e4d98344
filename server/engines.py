"""The app's models. ``Engines`` is built once per app (or CLI command), owned by it and handed to the sessions and
sources, the chat service, the audio API, gRPC and the CLI; it builds each model once, the session models at
start-up and the rest on first use, and closes them with the app.

There is no process-wide model cache: loaded weights live in a ``ModelPool``. An ``Engines`` makes its own
unless given one; a process that starts many apps (the test suite) builds one pool and hands it to each app, so
each set of weights loads once. Backends that hold event-loop resources (``per_app`` in their registration, e.g.
the LLM router) are never pooled: each app builds and closes its own."""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from aiohttp import web

from models.detectors import load_detector
from models.embeddings import TextEmbedder
from models.faces import FACE_MODELS
from models.llm import LANGUAGE_MODELS, LanguageModel
from models.plates import TEXT_READERS
from models.registry import BackendConfig, Registry
from models.stt import SPEECH_TO_TEXT, SpeechToText
from models.stt.batch import BatchedWhisper
from models.stt.whisper import WhisperConfig
from models.tts import TEXT_TO_SPEECH, TextToSpeech
from models.turn import SmartTurnV3
from models.vad import SileroVadModel
from pipelines.clock import Clock
from pipelines.ports import AudioAnalyzer, TimelineSink, VideoAnalyzer
from pipelines.protocol import SessionConfig
from pipelines.session import SessionPipeline
from pipelines.video.batcher import FrameDetector, InferenceBatcher
from pipelines.video.faces import FaceGallery, FaceRecognizer, StreamFaces
from pipelines.video.plates import PlateReader, StreamPlates, detector_labels, label_problems
from pipelines.video.workers import DetectorWorkers
from pipelines.voice.config import VoiceLoopConfig, VoiceLoopOptions
from pipelines.voice.engine import VoiceEngine
from pipelines.voice.loop import VoiceLoop
from pipelines.voice.recall import ContextProvider
from server import __version__
from server.config import Settings

if TYPE_CHECKING:  # imported where a detector is built: tracking's Norfair and supervision cost ~1.3 s to import
    from pipelines.video.analyzer import DetectorVideoAnalyzer

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass
class Analyzers:
    """Factories for the analysers each new pipeline gets; None means the counting-only seams."""

    video: Callable[[], VideoAnalyzer] | None = None
    audio: Callable[[str], AudioAnalyzer] | None = None  # given the origin: webrtc, rtsp or file
    closers: list[Callable[[], Awaitable[None]]] = dataclasses.field(default_factory=list)

    async def close(self) -> None:
        for close in self.closers:
            await close()

    def pipeline(self, settings: Settings, session_id: str, *, origin: str, clock: Clock, emit: Callable[..., None],
                 config: SessionConfig, timeline: TimelineSink | None = None) -> SessionPipeline:
        """A session pipeline with this process's analysers and the configured limits."""
        return SessionPipeline(
            session_id,
            origin=origin,
            clock=clock,
            emit=emit,
            config=config,
            server_version=__version__,
            video_analyzer=self.video() if self.video else None,
            audio_analyzer=self.audio(origin) if self.audio else None,
            metrics_interval_s=settings.sessions.metrics_interval_s,
            audio_queue_frames=settings.sessions.audio_queue_frames,
            timeline=timeline,
        )


class ModelPool:
    """Loaded models keyed by what they were loaded from (kind and config); loading blocks, so ask from a worker
    thread. Whoever makes a pool owns it and closes it (``close``) when no app uses it any more."""

    def __init__(self) -> None:
        self._models: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[Any, ...], load: Callable[[], T]) -> T:
        with self._lock:  # one load at a time: two apps asking for the same weights load them once
            if key not in self._models:
                started = time.perf_counter()
                self._models[key] = load()
                log.info("%s model loaded in %.1f s", key[0], time.perf_counter() - started)
            return self._models[key]

    def backend(self, registry: Registry[T], config: BackendConfig) -> T:
        """``registry``'s model for ``config``, loaded once per pool (the caller must not close it)."""
        return self.get((registry.kind, config.model_dump_json()), lambda: registry.build(config))

    async def close(self) -> None:
        with self._lock:
            models, self._models = list(self._models.values()), {}
        for model in models:
            close = getattr(model, "close", None)
            if close is not None:
                result = close()
                if inspect.isawaitable(result):
                    await result


def build_batcher(settings: Settings) -> FrameDetector:
    """The detector (loaded now, for this app alone: its batcher thread is its only caller) and its batcher; or, with
    ``video.detector_workers``, that many processes that each load it and batch (started now)."""
    video = settings.video
    if video.detector_workers:
        if settings.models.detector.backend == "none":
            raise ValueError("models.detector.backend is 'none': there is no detector to batch for")
        workers = DetectorWorkers(settings.models.detector, workers=video.detector_workers, max_batch=video.max_batch,
                                  max_wait_ms=video.max_wait_ms, nice=video.inference_nice,
                                  answer_timeout_s=video.detector_worker_timeout_s)
        workers.start()
        return workers
    detector = load_detector(settings.models.detector)
    if detector is None:
        raise ValueError("models.detector.backend is 'none': there is no detector to batch for")
    log.info("detector %s loaded on %s", detector.name, detector.device)
    return InferenceBatcher(detector, max_batch=settings.video.max_batch, max_wait_ms=settings.video.max_wait_ms,
                            nice=settings.video.inference_nice)


def voice_loop_config(settings: Settings, origin: str) -> VoiceLoopConfig:
    """One session's voice loop config: ``voice``'s options, and echo gating for its ``origin`` (webrtc, rtsp, file,
    grpc): ``auto`` is on for sources, which have no echo cancelling."""
    voice = settings.voice
    echo_gating = voice.echo_gating == "on" or (voice.echo_gating == "auto" and origin in ("rtsp", "file"))
    return VoiceLoopConfig(**voice.model_dump(include=set(VoiceLoopOptions.model_fields)), echo_gating=echo_gating,
                           system_prompt=voice.system_prompt)


class VoiceLoops:
    """Makes each session's voice loop (``Analyzers.audio``): the app's voice models, the config for its origin,
    and the app's memory as its ``recall`` when voice recall is on (``server.services`` gives it)."""

    def __init__(self, engine: VoiceEngine, settings: Settings, recall: ContextProvider | None = None) -> None:
        self.engine, self.settings, self.recall = engine, settings, recall

    def __call__(self, origin: str, *, system_prompt: str | None = None) -> VoiceLoop:
        """``system_prompt``: instead of ``voice.system_prompt`` (a gRPC conversation's own)."""
        config = voice_loop_config(self.settings, origin)
        if system_prompt:
            config = config.model_copy(update={"system_prompt": system_prompt})
        return VoiceLoop(self.engine, config, recall=self.recall)

    def with_recall(self, recall: ContextProvider) -> VoiceLoops:
        return VoiceLoops(self.engine, self.settings, recall)


class Engines:
    """The models of one app. ``analyzers`` (detector batcher, voice loop) are what every session needs: the app
    builds them at start-up (first access); the others (chat LLM and embedder, gRPC's STT, batch STT, TTS) when
    first asked for, on the caller's thread (call them from a worker thread: they block while loading). One LLM
    per app: the voice loop, the chat service and gRPC share its state (a router's in-flight counts, health)."""

    def __init__(self, settings: Settings, analyzers: Analyzers | None = None, models: ModelPool | None = None) -> None:
        self.settings = settings
        self.models = models if models is not None else ModelPool()
        self._owns_models = models is None
        self._analyzers = analyzers
        self._lock = threading.RLock()  # the analyzers build the LLM, STT and TTS through the same methods
        self._built: dict[str, Any] = {}
        self._per_app: list[Any] = []  # built for this app alone (not pooled): closed with it

    def _once(self, name: str, build: Callable[[], T]) -> T:
        with self._lock:
            if name not in self._built:
                self._built[name] = build()
            return self._built[name]

    def _backend(self, registry: Registry[T], config: BackendConfig) -> T:
        if registry.backend(config).per_app:
            model = registry.build(config)
            self._per_app.append(model)
            return model
        return self.models.backend(registry, config)

    @property
    def analyzers(self) -> Analyzers:
        """The session models (blocking on first access: the app takes them at start-up)."""
        with self._lock:
            if self._analyzers is None:
                self._analyzers = self._build_analyzers()
            return self._analyzers

    def _build_analyzers(self) -> Analyzers:
        settings = self.settings
        video: Callable[[], DetectorVideoAnalyzer] | None = None
        audio: VoiceLoops | None = None
        closers: list[Callable[[], Awaitable[None]]] = []
        if settings.models.detector.backend != "none":
            from pipelines.video.analyzer import DetectorVideoAnalyzer  # here: only a detector needs its tracking

            batcher = build_batcher(settings)
            if settings.video.plates.enabled:  # labels the detector cannot give are named now, not never read
                for problem in label_problems(settings.video.plates.labels, batcher.name,
                                              *detector_labels(batcher.detector)):
                    log.warning("%s", problem)
            annotators = self._annotators()
            video = lambda: DetectorVideoAnalyzer(batcher, [make() for make in annotators])  # noqa: E731
            closers.append(batcher.close)
        elif settings.video.plates.enabled:
            log.warning("video.plates.enabled: models.detector.backend is 'none': no vehicle is ever detected, so no "
                        "plate will be read")
        if settings.voice.enabled:
            engine = self.voice_engine()
            audio = VoiceLoops(engine, settings)
            closers.append(engine.close)
        return Analyzers(video=video, audio=audio, closers=closers)

    def voice_engine(self) -> VoiceEngine:
        """The voice loop's models (its executors are its own: one engine per app)."""
        turn = None
        if self.settings.voice.turn_detection == "smart-turn":
            turn = self.models.get(("smart-turn",), SmartTurnV3)
        engine = VoiceEngine(vad=self.models.get(("vad",), SileroVadModel), stt=self.stt(), llm=self.llm(),
                             tts=self.tts(), turn=turn)
        log.info("voice loop models: %s", engine.names)
        return engine

    def llm(self) -> LanguageModel:
        return self._once("llm", lambda: self._backend(LANGUAGE_MODELS, self.settings.models.llm))

    def stt(self) -> SpeechToText:
        return self._once("stt", lambda: self._backend(SPEECH_TO_TEXT, self.settings.models.stt))

    def tts(self) -> TextToSpeech:
        return self._once("tts", lambda: self._backend(TEXT_TO_SPEECH, self.settings.models.tts))

    def embedder(self) -> TextEmbedder:
        """MiniLM: the chat API's semantic cache and the memory's vectors."""

        def load() -> TextEmbedder:
            from models.embeddings import MiniLmEmbedder  # deferred: imports torch

            return MiniLmEmbedder()

        return self._once("embedder", lambda: self.models.get(("embedder",), load))

    def batch_stt(self) -> BatchedWhisper:
        """Batch transcription's Whisper: its own instance (apart from the live one); one CTranslate2 worker per
        job thread plus one for direct requests. Whisper's keys come from ``models.stt`` when that is Whisper."""
        config = self.settings.transcription
        live = self.settings.models.stt
        whisper = live if isinstance(live, WhisperConfig) else WhisperConfig()
        model_dir = config.model_dir or whisper.model_dir
        key = ("batch-stt", model_dir, whisper.device, whisper.compute_type, config.cpu_threads, config.workers)
        return self._once("batch_stt", lambda: self.models.get(key, lambda: BatchedWhisper(
            model_dir, device=whisper.device, compute_type=whisper.compute_type, cpu_threads=config.cpu_threads,
            num_workers=config.workers + 1)))

    def faces(self) -> FaceRecognizer:
        """Face recognition (``video.faces``): the model (pooled) and the people enrolled under
        ``storage.data_dir``/faces; built on first use (the sessions' at start-up, or the enrolment API's)."""

        def build() -> FaceRecognizer:
            faces = self.settings.video.faces
            recognizer = FaceRecognizer(self.models.backend(FACE_MODELS, faces.model), self.face_gallery(),
                                        faces)
            self._per_app.append(recognizer)  # its thread is this app's
            return recognizer

        return self._once("faces", build)

    def face_gallery(self) -> FaceGallery:
        """The people enrolled under ``storage.data_dir``/faces (listing or deleting them needs no model)."""
        return self._once("face_gallery", lambda: FaceGallery(self.settings.storage.data_dir / "faces"))

    def plates(self) -> PlateReader:
        """Licence plates (``video.plates``): the text reader (pooled) and the plate rules; built on first use."""

        def build() -> PlateReader:
            plates = self.settings.video.plates
            reader = PlateReader(self.models.backend(TEXT_READERS, plates.model), plates)
            self._per_app.append(reader)
            return reader

        return self._once("plates", build)

    def _annotators(self) -> list[Callable[[], StreamFaces | StreamPlates]]:
        """What each stream's analyser adds to its tracks: identity (video.faces), plate (video.plates)."""
        makers: list[Callable[[], StreamFaces | StreamPlates]] = []
        if self.settings.video.faces.enabled:
            recognizer = self.faces()
            makers.append(lambda: StreamFaces(recognizer))
        if self.settings.video.plates.enabled:
            reader = self.plates()
            makers.append(lambda: StreamPlates(reader))
        return makers

    def loaded(self, name: str) -> bool:
        return name in self._built

    async def close_session_models(self) -> None:
        """On shutdown, once the sessions are closed."""
        if self._analyzers is not None:
            await self._analyzers.close()

    async def close(self) -> None:
        """On cleanup, after every handler has finished (a chat stream may still use the router at shutdown)."""
        models, self._per_app = self._per_app, []
        for model in models:
            await model.close()
        if self._owns_models:
            await self.models.close()


ENGINES = web.AppKey("engines", Engines)
