"""The batch worker pool: its own Whisper instance and its own threads, apart from the live voice loop's.

Job steps run on the pool's job threads (one per concurrent job); direct requests (a short upload answered in
the same HTTP request) run on one request thread, so a short request waits at most for the step in front of it,
never for a whole job. The decoding that validates a job's upload (up to hours of audio) has a thread of its
own, so it never delays a short request either. Direct requests and validations are bounded: beyond
``max_pending_requests`` waiting or running, :class:`EngineBusy` is raised.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO, TypeVar

import numpy as np

from models.stt.batch import DEFAULT_MAX_CUE_S, BatchedWhisper
from pipelines.batch.decode import SAMPLE_RATE, audio_duration, decode_audio_file
from pipelines.batch.formats import Transcript
from pipelines.batch.telemetry import AUDIO_SECONDS, STEP_SECONDS

log = logging.getLogger(__name__)
T = TypeVar("T")


class EngineBusy(Exception):
    """Too many direct requests are waiting; try again later."""


def transcribe_audio(
    model: BatchedWhisper,
    audio: np.ndarray,
    *,
    language: str | None = "en",
    prompt: str | None = None,
    temperature: float = 0.0,
    batch_size: int = 8,
    max_chunk_s: float = 30.0,
    max_cue_s: float = DEFAULT_MAX_CUE_S,
    on_progress: Callable[[float], None] | None = None,
) -> Transcript:
    """Plan ``audio`` into VAD-cut chunks and decode them ``batch_size`` at a time. BLOCKING.

    ``on_progress(seconds)`` is called after each batch with the audio seconds it covered (chunks plus the
    silence between them), so the calls add up to the audio's duration.
    """
    chunks = model.plan(audio, max_chunk_s)
    duration = audio.size / SAMPLE_RATE
    segments = []
    language_found = language or "en"
    covered = 0.0
    for first in range(0, len(chunks), batch_size):
        batch = chunks[first:first + batch_size]
        per_chunk, language_found = model.transcribe_chunks(
            audio, batch, language=language, batch_size=batch_size, initial_prompt=prompt, temperature=temperature,
            max_cue_s=max_cue_s)
        segments.extend(s for chunk_segments in per_chunk for s in chunk_segments)
        if on_progress is not None:
            done_to = duration if first + batch_size >= len(chunks) else chunks[first + batch_size].start
            on_progress(done_to - covered)
            covered = done_to
    if on_progress is not None and covered < duration:
        on_progress(duration - covered)  # no speech at all, or trailing silence
    return Transcript(language=language_found, duration=duration, segments=tuple(segments))


class TranscriptionEngine:
    """The batch model (loaded on first use), the job threads and the request thread."""

    def __init__(
        self,
        load_model: Callable[[], BatchedWhisper],
        *,
        job_threads: int = 1,
        batch_size: int = 8,
        max_chunk_s: float = 30.0,
        max_cue_s: float = DEFAULT_MAX_CUE_S,
        max_pending_requests: int = 8,
        nice: int = 0,
    ) -> None:
        self._load_model = load_model
        self._model: BatchedWhisper | None = None
        self._model_lock = asyncio.Lock()
        self.batch_size = batch_size
        self.max_chunk_s = max_chunk_s
        self.max_cue_s = max_cue_s
        self.max_pending_requests = max_pending_requests
        self._pending_requests = 0
        # Lower CPU priority for all batch threads; the model loads on one of them, so CTranslate2's own threads
        # inherit it too: on a busy CPU the live voice loop's decodes run first.
        self._job_executor = ThreadPoolExecutor(job_threads, thread_name_prefix="vigil-batch-stt",
                                                initializer=_lower_priority, initargs=(nice,))
        self._request_executor = ThreadPoolExecutor(1, thread_name_prefix="vigil-request-stt",
                                                    initializer=_lower_priority, initargs=(nice,))
        self._probe_executor = ThreadPoolExecutor(1, thread_name_prefix="vigil-probe-stt",
                                                  initializer=_lower_priority, initargs=(nice,))

    @property
    def pending_requests(self) -> int:
        """Direct requests waiting for or running on the request thread."""
        return self._pending_requests

    @property
    def loaded(self) -> bool:
        return self._model is not None

    async def model(self) -> BatchedWhisper:
        """The batch model; the first call loads it (seconds, on the request thread)."""
        async with self._model_lock:
            if self._model is None:
                self._model = await asyncio.get_running_loop().run_in_executor(
                    self._request_executor, self._load_model)
                log.info("batch transcription model %s loaded", self._model.name)
            return self._model

    def use_model_for_test(self, model: BatchedWhisper) -> None:
        """Test seam: decode with this model (e.g. a HeldModelForTest around the loaded one)."""
        self._model = model

    async def job_step(self, fn: Callable[..., T], *args: Any) -> T:
        """Run one blocking step of a job on the job threads."""
        return await asyncio.get_running_loop().run_in_executor(self._job_executor, fn, *args)

    async def _request(self, fn: Callable[..., T], *args: Any, executor: ThreadPoolExecutor | None = None) -> T:
        if self._pending_requests >= self.max_pending_requests:
            raise EngineBusy(f"{self._pending_requests} transcription requests are already waiting")
        self._pending_requests += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(executor or self._request_executor, fn, *args)
        finally:
            self._pending_requests -= 1

    async def probe(self, path: Path, max_seconds: float) -> float:
        """Decode an upload to check it is audio within ``max_seconds`` (without keeping it); its duration in
        seconds. Raises AudioDecodeError (the client's fault) or EngineBusy."""
        return await self._request(audio_duration, path, max_seconds, executor=self._probe_executor)

    async def transcribe_file(
        self, path: Path | BinaryIO, *, language: str | None, prompt: str | None, temperature: float,
        max_seconds: float,
    ) -> Transcript:
        """A direct request: decode and transcribe ``path`` (or an open file) now (on the request thread).
        Raises AudioDecodeError, ValueError (an unavailable language) or EngineBusy."""
        model = await self.model()
        model.check_language(language)

        def run() -> Transcript:
            audio = decode_audio_file(path, max_seconds)
            started = time.perf_counter()
            transcript = transcribe_audio(model, audio, language=language, prompt=prompt, temperature=temperature,
                                          batch_size=self.batch_size, max_chunk_s=self.max_chunk_s,
                                          max_cue_s=self.max_cue_s)
            STEP_SECONDS.labels(path="request").observe(time.perf_counter() - started)
            AUDIO_SECONDS.labels(path="request").inc(transcript.duration)
            return transcript

        return await self._request(run)

    def close(self) -> None:
        # A step already running finishes in its thread; its result is dropped (a job redoes it next start).
        self._job_executor.shutdown(wait=False, cancel_futures=True)
        self._request_executor.shutdown(wait=False, cancel_futures=True)
        self._probe_executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority(nice: int) -> None:
    """Raise this thread's nice value by ``nice`` (Linux: per thread; threads it starts inherit it)."""
    if nice > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), os.getpriority(os.PRIO_PROCESS, 0) + nice)
