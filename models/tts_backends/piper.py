"""``backend: piper``: a Piper voice on onnxruntime, deterministic (the packaged joe voice by default)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from models.registry import BackendConfig
from models.tts import PiperTts, TextToSpeech
from models.tts_backends import TEXT_TO_SPEECH


class PiperConfig(BackendConfig):
    backend: Literal["piper"] = "piper"
    voice: str | None = Field(None, description="Piper .onnx voice; None: the packaged voice.")


@TEXT_TO_SPEECH.register(PiperConfig)
def build(config: PiperConfig) -> TextToSpeech:
    return PiperTts(config.voice)
