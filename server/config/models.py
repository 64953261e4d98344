"""``models``: the detector, STT, LLM and TTS backends. Each is registered by name with its own config model
(``models/<kind>_backends/<name>.py``); a section here is the union of one kind's registered configs,
discriminated by ``backend`` (a section without ``backend`` means the kind's default backend), so a new backend
is one module there and nothing here changes."""

from __future__ import annotations

from pydantic import Field

from models.detectors import DETECTORS
from models.llm import LANGUAGE_MODELS
from models.llm.openai import LlmRouting, LlmUpstream
from models.stt import SPEECH_TO_TEXT
from models.tts import TEXT_TO_SPEECH
from server.config.base import Section

__all__ = ["DetectorModel", "LlmModel", "LlmRouting", "LlmUpstream", "ModelsSettings", "SttModel", "TtsModel"]

DetectorModel = DETECTORS.config_type()  # default yolo
SttModel = SPEECH_TO_TEXT.config_type()  # default whisper
LlmModel = LANGUAGE_MODELS.config_type()  # default embedded
TtsModel = TEXT_TO_SPEECH.config_type()  # default piper


class ModelsSettings(Section):
    detector: DetectorModel = Field(default_factory=DETECTORS.default_config)
    stt: SttModel = Field(default_factory=SPEECH_TO_TEXT.default_config)
    llm: LlmModel = Field(default_factory=LANGUAGE_MODELS.default_config)
    tts: TtsModel = Field(default_factory=TEXT_TO_SPEECH.default_config)
