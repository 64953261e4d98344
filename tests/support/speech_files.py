"""Audio files of Piper-synthesised speech for the transcription tests and the transcription benchmark."""

from __future__ import annotations

import re

import numpy as np

from pipelines.speech import wav_bytes as speech_wav_bytes
from tests.support.audio import silence, speech

RATE = 16_000


def wav_bytes(pcm: np.ndarray, rate: int = RATE) -> bytes:
    """int16 mono samples as a WAV file (the tests' one WAV writer: the speech API's own)."""
    return speech_wav_bytes(pcm, rate)


def spoken(sentences: list[str], pause_s: float = 1.0, rate: int = RATE) -> np.ndarray:
    """The sentences spoken one after the other, ``pause_s`` of silence after each (int16 mono)."""
    parts: list[np.ndarray] = []
    for sentence in sentences:
        parts += [speech(sentence, rate), silence(pause_s, rate)]
    return np.concatenate(parts)


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, for comparing transcripts."""
    return re.sub(r"[^\w\s]", " ", text.lower()).split()
