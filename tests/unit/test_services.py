"""One wiring (``server.services.build_services``): what a service needs from another is given at construction,
and no service changes another afterwards. No model is loaded here: the session analysers are handed in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from server.config import load_settings
from server.media.sessions import Analyzers
from server.services import build_services


class ContextOnlyAudioAnalyzerForTest:
    """Stands in for a voice loop: only the ``context_provider`` seam memory recall fills."""

    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.context_provider: Any = None


async def test_memory_recall_and_documents_are_given_at_construction_and_the_engines_analyzers_stay(tmp_path: Path):
    settings = load_settings(None, {
        "storage": {"data_dir": str(tmp_path / "events")},
        "memory": {"enabled": True, "data_dir": str(tmp_path / "memory"), "voice": {"enabled": True}},
        "transcription": {"data_dir": str(tmp_path / "jobs")},
    })
    given = Analyzers(audio=ContextOnlyAudioAnalyzerForTest)
    services = build_services(settings, given)
    try:
        assert services.engines.analyzers is given and given.audio is ContextOnlyAudioAnalyzerForTest  # untouched
        assert services.sessions.analyzers is services.analyzers is services.sources.analyzers
        loop = services.analyzers.audio("webrtc")
        assert isinstance(loop, ContextOnlyAudioAnalyzerForTest) and loop.origin == "webrtc"
        assert loop.context_provider is not None  # the memory's recall
        assert services.chat.document_retriever is not None
        assert services.sessions.timeline is services.timeline.recorders is services.sources.timeline
    finally:
        await services.timeline.close()
        if services.audio is not None:
            await services.audio.close()


async def test_without_memory_the_session_analyzers_are_the_engines_own(tmp_path: Path):
    settings = load_settings(None, {"storage": {"enabled": False, "data_dir": str(tmp_path / "events")},
                                    "memory": {"enabled": False},
                                    "transcription": {"data_dir": str(tmp_path / "jobs")}})
    given = Analyzers(audio=ContextOnlyAudioAnalyzerForTest)
    services = build_services(settings, given)
    try:
        assert services.analyzers is given and services.memory is None
        assert services.chat.document_retriever is None
        assert services.analyzers.audio("rtsp").context_provider is None
        assert not services.timeline.stored
    finally:
        await services.timeline.close()
        if services.audio is not None:
            await services.audio.close()
