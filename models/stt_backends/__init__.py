"""Speech-to-text backends (``models.stt``), one module each, declaring its config and registering its builder
with ``SPEECH_TO_TEXT``; every module here is loaded on import. Heavy imports stay inside the builders."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from models.registry import Registry

if TYPE_CHECKING:
    from models.stt import WhisperStt

# What a live STT backend returns: WhisperStt's interface (name, transcribe, transcribe_live), which the voice
# loop and gRPC call.
SPEECH_TO_TEXT: Registry[WhisperStt] = Registry("stt", default="whisper")

SPEECH_TO_TEXT.discover(sys.modules[__name__])
