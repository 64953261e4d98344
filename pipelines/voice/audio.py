"""Audio plumbing for the voice loop: one resampler to 16 kHz mono on the way in (and a watch for a digitally
silent track), and the reply track out."""

from __future__ import annotations

import asyncio
import fractions
import time
from collections.abc import Callable

import av
import numpy as np
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

VAD_RATE = 16000
OUT_RATE = 48000
OUT_FRAME = 960  # 20 ms at 48 kHz, what aiortc's Opus encoder expects


class InputResampler:
    """Any rate and layout -> float32 mono 16 kHz in [-1, 1], done once per session with PyAV's resampler."""

    def __init__(self) -> None:
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=VAD_RATE)

    def __call__(self, frame: av.AudioFrame) -> np.ndarray:
        frame.pts = None  # the resampler keeps its own timeline; WebRTC timestamps can jump
        chunks = [f.to_ndarray().reshape(-1) for f in self._resampler.resample(frame)]
        return np.concatenate(chunks).astype(np.float32) if chunks else np.zeros(0, np.float32)


class SilenceWatch:
    """Notices a digitally silent input track (a muted microphone sends zeros): true once per silent stretch of
    ``limit_s``."""

    def __init__(self, limit_s: float) -> None:
        self.limit_s = limit_s
        self._silent_s = 0.0
        self._reported = False

    def silent_too_long(self, samples: np.ndarray) -> bool:
        """``samples``: float32 at 16 kHz, in order."""
        if samples.size and np.abs(samples).max() > 1e-4:
            self._silent_s, self._reported = 0.0, False
            return False
        self._silent_s += samples.size / VAD_RATE
        if self._silent_s >= self.limit_s and not self._reported:
            self._reported = True
            return True
        return False


def resample_pcm(pcm: np.ndarray, rate: int, target: int = OUT_RATE) -> np.ndarray:
    """int16 mono at ``rate`` -> int16 mono at ``target`` (TTS output to the 48 kHz track)."""
    if rate == target or pcm.size == 0:
        return pcm.astype(np.int16)
    frame = av.AudioFrame.from_ndarray(pcm.astype(np.int16).reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = rate
    resampler = av.AudioResampler(format="s16", layout="mono", rate=target)
    out = [f.to_ndarray().reshape(-1) for f in resampler.resample(frame)]
    out += [f.to_ndarray().reshape(-1) for f in resampler.resample(None)]
    return np.concatenate(out) if out else np.zeros(0, np.int16)


def trim_silence(pcm: np.ndarray, rate: int, *, lead: bool, keep_tail_ms: float | None,
                 floor: int = 100) -> np.ndarray:
    """int16 speech with its leading near-silence cut (``lead``) and its trailing silence shortened to
    ``keep_tail_ms`` (None: kept whole). ``floor``: the level below which a sample counts as silence (-50 dBFS)."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > floor)
    if loud.size == 0:
        return pcm
    start = max(0, int(loud[0]) - rate // 200) if lead else 0  # keep 5 ms before the onset
    end = pcm.size if keep_tail_ms is None else min(pcm.size, int(loud[-1]) + 1 + int(rate * keep_tail_ms / 1000))
    return pcm[start:end]


class PacedAudioTrack(MediaStreamTrack):
    """20 ms frames of 48 kHz mono, released in real time (as a sound card would)."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._start: float | None = None
        self._timestamp = 0
        self._lead = 0.0  # seconds this track runs ahead of real time
        self._wake = asyncio.Event()  # set when the lead grows: the frame waited for may be due now

    async def _next_frame_time(self) -> int:
        """Wait until the next frame is due; returns its timestamp (in samples)."""
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.time()
            return self._timestamp
        self._timestamp += OUT_FRAME
        while (wait := self._start + self._timestamp / OUT_RATE - self._lead - time.time()) > 0:
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except TimeoutError:
                break
        return self._timestamp

    def _resume_now(self) -> None:
        """After a pause in pulling (a local playout that waited for speech): the next frame is due now, not a
        backlog of the pause's frames at once (which would play the reply faster than real time)."""
        if self._start is not None:
            self._start = time.time() - (self._timestamp + OUT_FRAME) / OUT_RATE

    @staticmethod
    def _frame(samples: np.ndarray, timestamp: int) -> av.AudioFrame:
        frame = av.AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate = OUT_RATE
        frame.pts = timestamp
        frame.time_base = fractions.Fraction(1, OUT_RATE)
        return frame


class ReplyAudioTrack(PacedAudioTrack):
    """The session's outbound audio: reply speech when there is some, silence otherwise, paced in real time.

    ``flush()`` (barge-in) drops everything not yet sent; the next 20 ms frame is silence.

    Speech after silence starts at once (not at the next 20 ms tick) and its first ``burst_ms`` go out back to
    back: a receiver's jitter buffer that holds a few packets before playing (aiortc's holds 4, 80 ms) then plays
    the first word that much sooner. The lead is given back during the following silence (frames 4 ms slower),
    so the track never drifts ahead for good.
    """

    LEAD_RETURN_S = 0.004  # per silent frame

    def __init__(self, burst_ms: float = 80.0) -> None:
        super().__init__()
        self.burst_s = burst_ms / 1000.0
        self._pending = np.zeros(0, np.int16)
        self._turn_of_audio: list[tuple[int, int]] = []  # (sample index where a turn's audio starts, turn)
        self._queued_total = 0
        self._sent_total = 0
        self.on_first_audio: Callable[[int, float], None] | None = None  # (turn, perf_counter) when sent
        self.on_silence_after_flush: Callable[[float], None] | None = None
        self.on_drained: Callable[[], None] | None = None  # the last queued reply sample went out
        self._flushed_at: float | None = None
        self._activity = asyncio.Event()  # speech queued or a flush to report: a local playout has work
        self._announced: set[int] = set()

    @property
    def playing(self) -> bool:
        return self._pending.size > 0

    def enqueue(self, pcm: np.ndarray, turn: int) -> None:
        """Append 48 kHz int16 mono speech for ``turn``."""
        if turn not in self._announced:
            self._turn_of_audio.append((self._queued_total, turn))
        if not self._pending.size and pcm.size:  # speech after silence: send it now, its first frames at once
            self._lead = max(self._lead, self.burst_s + OUT_FRAME / OUT_RATE)
            self._wake.set()
        self._queued_total += pcm.size
        self._pending = np.concatenate([self._pending, pcm.astype(np.int16)])
        self._activity.set()

    def flush(self) -> int:
        dropped = self._pending.size
        self._pending = np.zeros(0, np.int16)
        self._queued_total = self._sent_total
        self._turn_of_audio.clear()
        self._flushed_at = time.perf_counter()
        self._activity.set()
        return dropped

    async def recv_audible(self) -> av.AudioFrame:
        """``recv()`` for a local playout (a source's loudspeaker, with no peer): while there is nothing to play
        and no flush to report it waits for some instead of pacing silence, so an idle camera does not wake the
        event loop 50 times a second for frames nobody hears; speech is then paced as ``recv()`` does."""
        if not self._pending.size and self._flushed_at is None:
            self._activity.clear()
            await self._activity.wait()
            self._resume_now()
        return await self.recv()

    async def recv(self) -> av.AudioFrame:
        timestamp = await self._next_frame_time()
        chunk = self._pending[:OUT_FRAME]
        self._pending = self._pending[OUT_FRAME:]
        samples = np.zeros(OUT_FRAME, np.int16)
        samples[: chunk.size] = chunk
        if chunk.size:
            self._announce(chunk.size)
            if not self._pending.size and self.on_drained is not None:
                self.on_drained()
        else:
            self._lead = max(0.0, self._lead - self.LEAD_RETURN_S)
            if self._flushed_at is not None and self.on_silence_after_flush is not None:
                self.on_silence_after_flush((time.perf_counter() - self._flushed_at) * 1000.0)
                self._flushed_at = None
        return self._frame(samples, timestamp)

    def _announce(self, sent: int) -> None:
        """Report the first frame of each turn's audio leaving us (the end of voice-to-voice)."""
        position, self._sent_total = self._sent_total, self._sent_total + sent
        for start, turn in self._turn_of_audio:
            if position <= start < self._sent_total and turn not in self._announced:
                self._announced.add(turn)
                if self.on_first_audio is not None:
                    self.on_first_audio(turn, time.perf_counter())
        self._turn_of_audio = [(s, t) for s, t in self._turn_of_audio if s >= self._sent_total]
