"""A source's local playout of reply audio (no peer to send it to): idle, it waits for speech instead of pacing
20 ms frames of silence on the event loop; speech is still played in real time, not as a backlog."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from pipelines.voice.audio import OUT_FRAME, OUT_RATE, ReplyAudioTrack


async def _pull(track: ReplyAudioTrack, times: list[tuple[float, bool]]) -> None:
    while True:
        frame = await track.recv_audible()
        times.append((time.monotonic(), bool(np.any(frame.to_ndarray()))))


async def test_an_idle_playout_pulls_no_silence_and_speech_plays_in_real_time() -> None:
    track = ReplyAudioTrack(burst_ms=0)
    times: list[tuple[float, bool]] = []
    puller = asyncio.create_task(_pull(track, times))
    try:
        track.enqueue(np.full(OUT_FRAME, 1000, np.int16), turn=0)  # a first word: the pacing clock starts
        await asyncio.sleep(0.4)
        assert len(times) <= 2  # that frame (and the one that found the queue empty); recv() would pace ~20
        times.clear()

        frames = 10
        speech = np.full(frames * OUT_FRAME, 1000, np.int16)
        queued = time.monotonic()
        track.enqueue(speech, turn=1)  # after 0.4 s of idle time
        for _ in range(100):
            if sum(audible for _, audible in times) >= frames:
                break
            await asyncio.sleep(0.02)
        audible = [at for at, loud in times if loud]
        assert len(audible) == frames
        assert audible[0] - queued < 0.1  # it starts at once, after the idle pause
        # paced like a loudspeaker: the 0.4 s of idle time is not made up as a burst of frames
        assert audible[-1] - audible[0] >= (frames - 1) * OUT_FRAME / OUT_RATE * 0.6

        await asyncio.sleep(0.3)
        assert len(times) <= frames + 1  # idle again: at most the one frame that found the queue empty
    finally:
        puller.cancel()


async def test_a_flush_is_reported_by_an_idle_playout() -> None:
    track = ReplyAudioTrack(burst_ms=0)
    reported: list[float] = []
    track.on_silence_after_flush = reported.append
    times: list[tuple[float, bool]] = []
    puller = asyncio.create_task(_pull(track, times))
    try:
        track.enqueue(np.full(50 * OUT_FRAME, 1000, np.int16), turn=1)
        await asyncio.sleep(0.1)
        track.flush()  # barge-in
        for _ in range(50):
            if reported:
                break
            await asyncio.sleep(0.02)
        assert len(reported) == 1 and reported[0] < 100
    finally:
        puller.cancel()
