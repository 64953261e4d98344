"""Speech-to-text backends (``models.stt``), one module each, declaring its config and registering its builder
with ``SPEECH_TO_TEXT``; every module here is loaded on import. Heavy imports stay inside the builders."""

from __future__ import annotations

import sys
from typing import Any

from models.registry import Registry

# What a live STT backend returns: today WhisperStt's interface (transcribe, transcribe_live, name).
SPEECH_TO_TEXT: Registry[Any] = Registry("stt", default="whisper")

SPEECH_TO_TEXT.discover(sys.modules[__name__])
