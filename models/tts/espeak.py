"""``backend: espeak``: the espeak-ng binary (apt), one process per call; small and robotic."""

from __future__ import annotations

import shutil
import subprocess
from typing import Literal

import numpy as np
from pydantic import Field

from models.packaged import ModelNotAvailable
from models.registry import BackendConfig
from models.tts import TEXT_TO_SPEECH, TextToSpeech


class EspeakTts:
    """The ``espeak-ng`` binary, one process per call (``--stdout`` WAV). Thread-safe.

    ``voice``: an espeak-ng voice name (``espeak-ng --voices``); ``rate``: words per minute.
    ModelNotAvailable if the binary is missing (``apt-get install espeak-ng``) or the voice is unknown.
    """

    def __init__(self, voice: str = "en-us", rate: int = 175, binary: str = "espeak-ng") -> None:
        found = shutil.which(binary)
        if found is None:
            raise ModelNotAvailable(f"{binary!r} is not installed (apt-get install espeak-ng)")
        self._binary = found
        self.voice = voice
        self.rate = int(rate)
        self.name = f"espeak-ng:{voice}"
        # One short run tells the output rate and checks the voice.
        probe, self.sample_rate = self._run("a")
        if probe.size == 0 or self.sample_rate <= 0:
            raise ModelNotAvailable(f"espeak-ng produced no audio for voice {voice!r}")

    def synthesize(self, text: str) -> np.ndarray:
        """int16 mono samples at ``sample_rate``. BLOCKING (spawns espeak-ng)."""
        if not text.strip():
            return np.zeros(0, dtype=np.int16)
        samples, rate = self._run(text)
        if rate != self.sample_rate:  # pragma: no cover - espeak-ng's rate is fixed per voice
            raise RuntimeError(f"espeak-ng changed its sample rate from {self.sample_rate} to {rate}")
        return samples

    def _run(self, text: str) -> tuple[np.ndarray, int]:
        # Text goes through stdin so that text starting with "-" is never read as an option.
        cmd = [self._binary, "-v", self.voice, "-s", str(self.rate), "--stdout"]
        try:
            proc = subprocess.run(cmd, input=text.encode("utf-8"), capture_output=True, timeout=60, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ModelNotAvailable(f"espeak-ng failed to run: {exc}") from exc
        if proc.returncode != 0:
            message = proc.stderr.decode("utf-8", "replace").strip() or f"exit status {proc.returncode}"
            raise ModelNotAvailable(f"espeak-ng (voice {self.voice!r}) failed: {message}")
        return parse_streamed_wav(proc.stdout)


def parse_streamed_wav(data: bytes) -> tuple[np.ndarray, int]:
    """(int16 mono samples, sample rate) from a 16-bit PCM mono WAV whose size fields may be placeholders, as
    ``espeak-ng --stdout`` writes them. Empty input gives no samples and rate 0."""
    if not data:
        return np.zeros(0, dtype=np.int16), 0
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        raise ValueError("not a RIFF/WAVE stream")
    pos, rate, channels, bits = 12, 0, 0, 0
    while pos + 8 <= len(data):
        chunk_id = data[pos : pos + 4]
        size = int.from_bytes(data[pos + 4 : pos + 8], "little")
        body = pos + 8
        if chunk_id == b"fmt ":
            fmt = data[body : body + 16]
            channels = int.from_bytes(fmt[2:4], "little")
            rate = int.from_bytes(fmt[4:8], "little")
            bits = int.from_bytes(fmt[14:16], "little")
        elif chunk_id == b"data":
            if (channels, bits) != (1, 16):
                raise ValueError(f"expected 16-bit mono PCM, got {channels} channel(s) of {bits} bits")
            payload = data[body : min(len(data), body + size)]  # size is 0x7fff... while streaming
            payload = payload[: len(payload) // 2 * 2]
            return np.frombuffer(payload, dtype="<i2").astype(np.int16), rate
        pos = body + size + (size & 1)
    raise ValueError("WAV stream has no data chunk")


class EspeakConfig(BackendConfig):
    backend: Literal["espeak"] = "espeak"
    voice: str | None = Field(None, description="An espeak-ng voice name; None: en-us.")


@TEXT_TO_SPEECH.register(EspeakConfig)
def build(config: EspeakConfig) -> TextToSpeech:
    return EspeakTts(config.voice or "en-us")
