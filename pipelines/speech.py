"""Speech synthesis for the OpenAI-shaped ``/v1/audio/speech``: TTS on its own thread, bounded, and the result
encoded (PyAV/FFmpeg) as mp3, opus, aac, flac, wav or raw pcm, optionally faster or slower (FFmpeg ``atempo``,
pitch kept)."""

from __future__ import annotations

import asyncio
import io
import itertools
import wave
from concurrent.futures import ThreadPoolExecutor

import av
import numpy as np

from models.tts import TextToSpeech
from pipelines.voice.audio import resample_pcm
from pipelines.voice.sentences import split_sentences

SPEECH_FORMATS: tuple[str, ...] = ("mp3", "opus", "aac", "flac", "wav", "pcm")
CONTENT_TYPES = {
    "mp3": "audio/mpeg", "opus": "audio/ogg", "aac": "audio/aac", "flac": "audio/flac", "wav": "audio/wav",
    "pcm": "audio/pcm",
}
PCM_RATE = 24_000  # OpenAI's "pcm": raw 24 kHz 16-bit signed little-endian mono
OPUS_RATE = 48_000  # Opus only takes 8/12/16/24/48 kHz
_CONTAINERS = {"mp3": ("mp3", "libmp3lame"), "opus": ("ogg", "libopus"), "aac": ("adts", "aac"),
               "flac": ("flac", "flac")}


class SpeechBusy(Exception):
    """Too many speech requests are waiting; try again later."""


def change_speed(pcm: np.ndarray, rate: int, speed: float) -> np.ndarray:
    """Play ``speed`` times faster (0.25..4), pitch kept: FFmpeg's ``atempo`` (one stage takes 0.5..2)."""
    if speed == 1.0 or pcm.size == 0:
        return pcm
    stages: list[tuple[str, str]] = []
    remaining = speed
    while remaining > 2.0:
        stages.append(("atempo", "2.0"))
        remaining /= 2.0
    while remaining < 0.5:
        stages.append(("atempo", "0.5"))
        remaining /= 0.5
    stages.append(("atempo", f"{remaining:.6f}"))
    return _filter(pcm, rate, stages, rate)


def _filter(pcm: np.ndarray, rate: int, stages: list[tuple[str, str]], out_rate: int) -> np.ndarray:
    graph = av.filter.Graph()
    source = graph.add_abuffer(format="s16", sample_rate=rate, layout="mono", time_base=f"1/{rate}")
    nodes = [source, *(graph.add(name, args) for name, args in stages),
             graph.add("aformat", f"sample_fmts=s16:sample_rates={out_rate}:channel_layouts=mono"),
             graph.add("abuffersink")]
    for upstream, downstream in itertools.pairwise(nodes):
        upstream.link_to(downstream)
    graph.configure()
    frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    frame.pts = 0
    graph.push(frame)
    graph.push(None)
    out: list[np.ndarray] = []
    while True:
        try:
            out.append(graph.pull().to_ndarray().reshape(-1))
        except (av.error.BlockingIOError, av.error.EOFError):
            break
    return np.concatenate(out).astype(np.int16) if out else np.zeros(0, np.int16)


def wav_bytes(pcm: np.ndarray, rate: int) -> bytes:
    """int16 mono samples as a complete 16-bit PCM WAV file."""
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.astype("<i2").tobytes())
    return buffer.getvalue()


def encode(pcm: np.ndarray, rate: int, response_format: str) -> bytes:
    """int16 mono samples at ``rate`` as a complete file (or raw pcm) in ``response_format``."""
    if response_format == "pcm":
        return resample_pcm(pcm, rate, PCM_RATE).astype("<i2").tobytes()
    if response_format == "wav":
        return wav_bytes(pcm, rate)
    container_format, codec = _CONTAINERS[response_format]
    if response_format == "opus":
        pcm, rate = resample_pcm(pcm, rate, OPUS_RATE), OPUS_RATE
    buffer = io.BytesIO()
    with av.open(buffer, mode="w", format=container_format) as container:
        stream = container.add_stream(codec, rate=rate, layout="mono")
        resampler = av.AudioResampler(format=stream.codec_context.format.name, layout="mono", rate=rate)
        frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = None
        for resampled in [*resampler.resample(frame), *resampler.resample(None)]:
            container.mux(stream.encode(resampled))
        container.mux(stream.encode(None))
    return buffer.getvalue()


class SpeechSynthesizer:
    """One TTS engine on its own thread (speech requests never queue behind live voice turns), bounded."""

    def __init__(self, tts: TextToSpeech, max_pending_requests: int = 8) -> None:
        self.tts = tts
        self.max_pending_requests = max_pending_requests
        self._pending = 0
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="vigil-speech")

    async def speak(self, text: str, response_format: str, speed: float = 1.0) -> bytes:
        """The encoded audio of ``text``. Raises SpeechBusy when too many requests wait."""
        if self._pending >= self.max_pending_requests:
            raise SpeechBusy(f"{self._pending} speech requests are already waiting")
        self._pending += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._speak, text, response_format, speed)
        finally:
            self._pending -= 1

    def _speak(self, text: str, response_format: str, speed: float) -> bytes:
        # Sentence by sentence, as the voice loop speaks: long inputs stay within what the voice handles well.
        sentences = split_sentences(text, final=True)[0]
        parts = [self.tts.synthesize(sentence) for sentence in sentences]
        pcm = np.concatenate(parts) if parts else np.zeros(0, np.int16)
        return encode(change_speed(pcm, self.tts.sample_rate, speed), self.tts.sample_rate, response_format)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
