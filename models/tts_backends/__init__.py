"""Text-to-speech backends (``models.tts.TextToSpeech``), one module each, declaring its config and registering
its builder with ``TEXT_TO_SPEECH``; every module here is loaded on import."""

from __future__ import annotations

import sys

from models.registry import Registry
from models.tts import TextToSpeech

TEXT_TO_SPEECH: Registry[TextToSpeech] = Registry("tts", default="piper")

TEXT_TO_SPEECH.discover(sys.modules[__name__])
