"""The app's audio services behind ``/v1/audio/*``: batch transcription (the engine and the persisted job
queue, opened on first use) and speech synthesis (its voice loaded on first use)."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from aiohttp import web

from pipelines.batch.engine import TranscriptionEngine
from pipelines.batch.jobs import JobQueue, JobStoreInUse, JobStoreUnavailable
from pipelines.errors import ApiError
from pipelines.speech import SpeechSynthesizer
from server.config import Settings
from server.engines import Engines

log = logging.getLogger(__name__)


@dataclass
class AudioServices:
    settings: Settings
    engine: TranscriptionEngine
    jobs: JobQueue
    _jobs_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _speech: SpeechSynthesizer | None = None
    _speech_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    engines: Engines | None = None

    @classmethod
    def from_settings(cls, settings: Settings, engines: Engines) -> AudioServices:
        config = settings.transcription
        # The model loads on first use (on the engine's thread), not at start-up.
        engine = TranscriptionEngine(engines.batch_stt, job_threads=config.workers,
                                     batch_size=config.batch_size, max_chunk_s=config.max_chunk_s,
                                     max_cue_s=config.max_cue_s, max_pending_requests=config.max_pending_requests,
                                     nice=config.nice)
        jobs = JobQueue(config.data_dir, engine, workers=config.workers, max_active_jobs=config.max_active_jobs,
                        max_attempts=config.max_attempts, max_audio_s=config.max_job_audio_s)
        return cls(settings, engine, jobs, engines=engines)

    async def started_jobs(self) -> JobQueue:
        """The job queue, opened (and its workers started) on first use. Raises ApiError (job_store_in_use) if another
        process holds its data directory."""
        async with self._jobs_lock:
            if not self.jobs.started:
                try:
                    await self.jobs.start()
                except JobStoreInUse as in_use:
                    raise ApiError("job_store_in_use", str(in_use)) from None
                except JobStoreUnavailable as unavailable:
                    log.error("%s", unavailable)
                    raise ApiError("job_store_unavailable", str(unavailable)) from None
            return self.jobs

    @property
    def speech_loaded(self) -> bool:
        return self._speech is not None

    async def speech(self) -> SpeechSynthesizer:
        async with self._speech_lock:
            if self._speech is None:
                assert self.engines is not None
                tts = await asyncio.to_thread(self.engines.tts)
                self._speech = SpeechSynthesizer(tts, self.settings.speech.max_pending_requests)
            return self._speech

    async def close(self) -> None:
        await self.jobs.close()
        self.engine.close()
        if self._speech is not None:
            self._speech.close()


AUDIO = web.AppKey("audio", AudioServices)  # only with transcription or speech enabled
