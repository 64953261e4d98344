"""Audio arriving over gRPC (``AudioChunk``): raw PCM16 at any rate and channel count, or a container/codec that
FFmpeg (PyAV) decodes. Everything becomes what the speech models take: float32 mono 16 kHz in [-1, 1]."""

from __future__ import annotations

import io
from collections.abc import Iterator

import av
import numpy as np

from pipelines.batch.decode import AudioDecodeError, decode_audio_file
from pipelines.errors import ApiError
from pipelines.voice.audio import InputResampler

PCM_ENCODINGS = frozenset({"", "pcm16", "pcm_s16le", "s16le", "linear16"})
# encoding -> FFmpeg demuxer (None: let FFmpeg probe the bytes)
CONTAINER_FORMATS: dict[str, str | None] = {
    "wav": "wav", "ogg": "ogg", "opus": "ogg", "mp3": "mp3", "flac": "flac", "webm": "webm", "mkv": "matroska",
    "mp4": "mp4", "m4a": "mp4", "aac": "aac", "auto": None,
}
MAX_PCM_RATE = 384000
FRAME_S = 0.02  # PCM is fed to the voice loop in 20 ms frames, as a WebRTC track delivers it


class BadAudio(ApiError):
    """The client's audio is malformed or in an encoding we do not take; the message says which."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_audio", message)


def encoding_of(name: str) -> str:
    encoding = name.strip().lower()
    if encoding in PCM_ENCODINGS:
        return "pcm16"
    if encoding not in CONTAINER_FORMATS:
        known = ", ".join(["pcm16", *CONTAINER_FORMATS])
        raise BadAudio(f"unknown audio encoding {name!r}; use one of: {known}")
    return encoding


class PcmDecoder:
    """PCM16 chunks of one stream -> av.AudioFrames (for the voice loop) or 16 kHz float samples (for STT)."""

    def __init__(self, sample_rate: int, channels: int) -> None:
        if not 8000 <= sample_rate <= MAX_PCM_RATE:
            raise BadAudio(f"pcm16 needs sample_rate between 8000 and {MAX_PCM_RATE} Hz, got {sample_rate}")
        if channels not in (1, 2):
            raise BadAudio(f"pcm16 takes 1 or 2 interleaved channels, got {channels}")
        self.sample_rate, self.channels = sample_rate, channels
        self.samples = 0  # per channel, so far
        self._resample = InputResampler()

    @property
    def seconds(self) -> float:
        return self.samples / self.sample_rate

    def frames(self, data: bytes) -> Iterator[av.AudioFrame]:
        width = 2 * self.channels
        if len(data) % width:
            raise BadAudio(f"pcm16 chunk of {len(data)} bytes is not a whole number of {width}-byte samples")
        pcm = np.frombuffer(data, dtype="<i2").astype(np.int16)
        step = max(1, int(self.sample_rate * FRAME_S)) * self.channels
        layout = "mono" if self.channels == 1 else "stereo"
        for start in range(0, pcm.size, step):
            part = pcm[start:start + step]
            frame = av.AudioFrame.from_ndarray(part.reshape(1, -1), format="s16", layout=layout)
            frame.sample_rate = self.sample_rate
            self.samples += frame.samples
            yield frame

    def samples_16k(self, data: bytes) -> np.ndarray:
        chunks = [self._resample(frame) for frame in self.frames(data)]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.float32)


def decode_container(data: bytes, encoding: str) -> np.ndarray:
    """A whole file's bytes -> float32 mono 16 kHz, as the transcription API decodes uploads. Blocking (FFmpeg):
    run it on a worker thread."""
    try:
        return decode_audio_file(io.BytesIO(data), container_format=CONTAINER_FORMATS[encoding])
    except AudioDecodeError as error:
        raise BadAudio(f"cannot decode the audio as {encoding}: {error}") from None
