"""Speech to text: the protocol live backends follow (what the voice loop and gRPC call) and the registry of
backends, one module each in this package declaring its config, its builder and its code (``whisper``:
CTranslate2 through faster-whisper). ``batch`` is Whisper for recorded files (``/v1/audio/transcriptions``).
Heavy imports stay inside the builders and models, so loading the config stays cheap."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from models.registry import Registry


@dataclass(frozen=True, slots=True)
class TranscriptSegment:
    start: float  # seconds from the start of the audio passed in
    end: float
    text: str
    avg_logprob: float
    no_speech_prob: float


@dataclass(frozen=True, slots=True)
class TranscriptResult:
    text: str  # segments joined, stripped
    segments: tuple[TranscriptSegment, ...]
    language: str
    duration: float  # seconds of audio transcribed

class SpeechToText(Protocol):
    """A live STT model: 16 kHz mono float32 in [-1, 1]; blocking and thread-safe (callers use worker threads)."""

    name: str

    def transcribe(self, audio: np.ndarray, language: str | None = "en",
                   initial_prompt: str | None = None) -> TranscriptResult:
        """One utterance or clip (a gRPC stream's audio, a file's)."""
        ...

    def transcribe_live(self, audio: np.ndarray, language: str | None = "en") -> TranscriptResult:
        """One live voice turn (may decode a window fitted to the utterance)."""
        ...


SPEECH_TO_TEXT: Registry[SpeechToText] = Registry("stt", default="whisper")

SPEECH_TO_TEXT.discover(sys.modules[__name__])  # each module registers itself on import
