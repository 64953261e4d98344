"""One wiring (``server.services.build_services``): what a service needs from another is given at construction,
and no service changes another afterwards. No model is loaded here: the voice models are stand-ins the loop is
built with but never asked (no audio reaches it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.memory.recall import MemoryRecall
from pipelines.voice.engine import VoiceEngine
from pipelines.voice.loop import VoiceLoop
from server.config import Settings, load_settings
from server.engines import Analyzers, VoiceLoops
from server.services import build_services


class UnaskedModelForTest:
    """Named seam: a voice model a loop is built with and never asked (these tests send it no audio)."""

    name = "unasked"


def _voice_loops(settings: Settings) -> VoiceLoops:
    model: Any = UnaskedModelForTest()
    return VoiceLoops(VoiceEngine(vad=model, stt=model, llm=model, tts=model), settings)


def _settings(tmp_path: Path, **overrides: Any) -> Settings:
    return load_settings(None, {"storage": {"data_dir": str(tmp_path / "events")},
                                "transcription": {"data_dir": str(tmp_path / "jobs")}, **overrides})


async def test_memory_recall_and_documents_are_given_at_construction_and_the_engines_analyzers_stay(tmp_path: Path):
    settings = _settings(tmp_path, memory={"enabled": True, "data_dir": str(tmp_path / "memory"),
                                           "voice": {"enabled": True}})
    given = Analyzers(audio=_voice_loops(settings))
    services = build_services(settings, given)
    try:
        assert services.engines.analyzers is given and isinstance(given.audio, VoiceLoops)
        assert given.audio.recall is None  # untouched: gRPC conversations use the engines' own
        assert services.sessions.analyzers is services.analyzers is services.sources.analyzers
        loop = services.analyzers.audio("webrtc")
        assert isinstance(loop, VoiceLoop)
        # The memory's recall, a constructor argument of the loop, asking this app's index.
        assert isinstance(loop.recall.memory, MemoryRecall) and loop.recall.memory.index is services.memory
        assert services.chat.document_retriever is not None
        assert services.sessions.timeline is services.timeline.recorders is services.sources.timeline
        await loop.close()
    finally:
        await services.timeline.close()
        if services.audio is not None:
            await services.audio.close()
        await given.close()


async def test_without_memory_the_session_analyzers_are_the_engines_own(tmp_path: Path):
    settings = _settings(tmp_path, storage={"enabled": False, "data_dir": str(tmp_path / "events")},
                         memory={"enabled": False})
    given = Analyzers(audio=_voice_loops(settings))
    services = build_services(settings, given)
    try:
        assert services.analyzers is given and services.memory is None
        assert services.chat.document_retriever is None
        loop = services.analyzers.audio("rtsp")
        assert isinstance(loop, VoiceLoop) and loop.recall.memory is None
        await loop.close()
        assert not services.timeline.stored
    finally:
        await services.timeline.close()
        if services.audio is not None:
            await services.audio.close()


async def test_a_voice_loop_gets_its_prompt_at_construction(tmp_path: Path):
    """gRPC Converse's own system prompt is the loop's config from the start, nothing set on it afterwards."""
    settings = _settings(tmp_path, voice={"system_prompt": "You are the configured assistant."})
    voice_loops = _voice_loops(settings)
    own = voice_loops("grpc", system_prompt="Answer in French.")
    configured = voice_loops("grpc")
    unset = voice_loops("grpc", system_prompt="")  # an empty ConversationConfig field means "not set"
    try:
        assert own.config.system_prompt == "Answer in French."
        assert configured.config.system_prompt == unset.config.system_prompt == "You are the configured assistant."
        assert own.config.max_reply_tokens == configured.config.max_reply_tokens == settings.voice.max_reply_tokens
    finally:
        for loop in (own, configured, unset):
            await loop.close()
        await voice_loops.engine.close()
