"""Audio files of Piper-synthesised speech for the transcription tests and the transcription benchmark."""

from __future__ import annotations

import io
import re
import wave

import numpy as np

from tests.support.audio import silence, speech

RATE = 16_000


def wav_bytes(pcm: np.ndarray, rate: int = RATE) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()


def spoken(sentences: list[str], pause_s: float = 1.0, rate: int = RATE) -> np.ndarray:
    """The sentences spoken one after the other, ``pause_s`` of silence after each (int16 mono)."""
    parts: list[np.ndarray] = []
    for sentence in sentences:
        parts += [speech(sentence, rate), silence(pause_s, rate)]
    return np.concatenate(parts)


def words(text: str) -> list[str]:
    """Lower-case words without punctuation, for comparing transcripts."""
    return re.sub(r"[^\w\s]", " ", text.lower()).split()
