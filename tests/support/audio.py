"""Audio for voice tests: speech synthesised with Piper (deterministic), a scripted microphone track, and a
recorder for the reply audio a client receives."""

from __future__ import annotations

import asyncio
import time
from functools import cache

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from pipelines.voice.audio import OUT_FRAME, OUT_RATE, PacedAudioTrack, resample_pcm


@cache
def _piper():
    from models.tts.piper import PiperTts

    return PiperTts()


@cache
def speech(text: str, rate: int = OUT_RATE) -> np.ndarray:
    """``text`` spoken by the packaged Piper voice, int16 mono at ``rate``."""
    tts = _piper()
    return resample_pcm(tts.synthesize(text), tts.sample_rate, rate)


def silence(seconds: float, rate: int = OUT_RATE) -> np.ndarray:
    return np.zeros(int(seconds * rate), np.int16)


@cache
def _word_aligner():
    from models.stt.whisper import LocalWhisper

    return LocalWhisper()._model  # faster-whisper's WhisperModel (tiny.en), for word timestamps


def word_cuts(text: str, rate: int = OUT_RATE) -> tuple[np.ndarray, list[tuple[str, int]]]:
    """``text`` spoken whole, and where it may be cut between words: (pcm, [(the words before the cut, sample
    index of the cut)], one cut after each word but the last, as Whisper counts them). A cut lies at the quietest
    10 ms within 80 ms of the boundary Whisper's word timestamps give."""
    pcm = speech(text, rate)
    audio16 = resample_pcm(pcm, rate, 16000).astype(np.float32) / 32768.0
    segments, _ = _word_aligner().transcribe(audio16, language="en", word_timestamps=True, beam_size=1)
    words = [word for segment in segments for word in segment.words]
    window = rate // 100
    cuts = []
    for after in range(1, len(words)):
        boundary = (words[after - 1].end + words[after].start) / 2
        search = range(max(0, int((boundary - 0.08) * rate)),
                       min(pcm.size - window, int((boundary + 0.08) * rate)), window // 2)
        cut = min(search, key=lambda start: rms(pcm[start:start + window])) + window // 2
        cuts.append(("".join(word.word for word in words[:after]).strip(), cut))
    return pcm, cuts


@cache
def speech_split(text: str, after_words: int, rate: int = OUT_RATE) -> tuple[np.ndarray, np.ndarray]:
    """``text`` spoken whole (one intonation, as a person pausing mid-sentence), cut in two after its first
    ``after_words`` words (as Whisper counts them), at :func:`word_cuts`' cut."""
    pcm, cuts = word_cuts(text, rate)
    _, cut = cuts[after_words - 1]
    return pcm[:cut], pcm[cut:]


def rms(samples: np.ndarray) -> float:
    return float(np.sqrt(np.mean(samples.astype(np.float64) ** 2))) if samples.size else 0.0


class ScriptedMicrophone(PacedAudioTrack):
    """A live microphone: silence (or low noise) in real time, and whatever the test says when it says it."""

    def __init__(self, noise: float = 0.0) -> None:
        super().__init__()
        self._queue = np.zeros(0, np.int16)
        self._noise = noise
        self._rng = np.random.default_rng(0)
        self.spoken = asyncio.Event()

    def say(self, pcm: np.ndarray) -> None:
        self._queue = np.concatenate([self._queue, pcm.astype(np.int16)])
        self.spoken.clear()

    @property
    def speaking(self) -> bool:
        return self._queue.size > 0

    async def recv(self) -> av.AudioFrame:
        timestamp = await self._next_frame_time()
        samples = (self._rng.normal(0, self._noise, OUT_FRAME) if self._noise else np.zeros(OUT_FRAME)).astype(np.int16)
        chunk, self._queue = self._queue[:OUT_FRAME], self._queue[OUT_FRAME:]
        samples[: chunk.size] += chunk
        if chunk.size and not self._queue.size:
            self.spoken.set()
        return self._frame(samples, timestamp)


class Recorder:
    """Consumes a received audio track; keeps mono 48 kHz samples with the wall time each frame arrived."""

    def __init__(self, track: MediaStreamTrack) -> None:
        self.track = track
        self.frames: list[tuple[float, np.ndarray]] = []
        self.on_frame = None
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=OUT_RATE)
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            try:
                frame = await self.track.recv()
            except MediaStreamError:
                return
            frame.pts = None
            for out in self._resampler.resample(frame):
                samples = out.to_ndarray().reshape(-1)
                self.frames.append((time.perf_counter(), samples))
                if self.on_frame is not None:
                    self.on_frame(samples)

    def audio(self, since: float = 0.0) -> np.ndarray:
        chunks = [s for t, s in self.frames if t >= since]
        return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)

    def first_loud(self, threshold: float = 300.0, since: float = 0.0) -> float | None:
        for t, s in self.frames:
            if t >= since and rms(s) > threshold:
                return t
        return None

    def last_loud(self, threshold: float = 300.0) -> float | None:
        loud = [t for t, s in self.frames if rms(s) > threshold]
        return loud[-1] if loud else None

    async def stop(self) -> None:
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
