"""Text to speech: the protocol and the registry of backends, one module each in this package declaring its
config, its builder and its code (``piper``: neural, the packaged en_US joe medium voice by default;
``espeak``: espeak-ng, robotic, tiny). ``synthesize`` is BLOCKING (tens to hundreds of milliseconds per sentence)
and thread-safe, so callers run it on worker threads; the voice loop feeds it one sentence at a time
(``pipelines.voice.sentences``)."""

from __future__ import annotations

import sys
from typing import Protocol, runtime_checkable

import numpy as np

from models.registry import Registry


@runtime_checkable
class TextToSpeech(Protocol):
    name: str
    sample_rate: int

    def synthesize(self, text: str) -> np.ndarray:
        """int16 mono samples at ``sample_rate`` (empty for text with nothing to say). Blocking."""
        ...


TEXT_TO_SPEECH: Registry[TextToSpeech] = Registry("tts", default="piper")

TEXT_TO_SPEECH.discover(sys.modules[__name__])  # each module registers itself on import
