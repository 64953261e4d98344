"""``backend: espeak``: the espeak-ng binary (apt), one process per call; small and robotic."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.registry import BackendConfig
from models.tts import EspeakTts, TextToSpeech
from models.tts_backends import TEXT_TO_SPEECH


class EspeakConfig(BackendConfig):
    backend: Literal["espeak"] = "espeak"
    voice: str | None = Field(None, description="An espeak-ng voice name; None: en-us.")


@TEXT_TO_SPEECH.register(EspeakConfig)
def build(config: EspeakConfig) -> TextToSpeech:
    return EspeakTts(config.voice or "en-us")
