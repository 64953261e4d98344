"""Asynchronous transcription jobs: a bounded, persisted queue and the workers that drain it.

A job's audio is stored on disk next to the database. A worker claims the oldest queued job, decodes its audio,
plans its chunks once (VAD pauses; stored), then decodes the chunks not yet done ``batch_size`` at a time,
saving each batch with the job's progress. When the server stops (even killed), the job stays ``running``
in the database; the next start queues it again and it resumes at its first undecoded chunk, so nothing is
lost and nothing is decoded twice into the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import secrets
import shutil
import sqlite3
import time
from pathlib import Path
from typing import IO

from pipelines.batch.decode import SAMPLE_RATE, AudioDecodeError, decode_audio_file
from pipelines.batch.engine import TranscriptionEngine
from pipelines.batch.formats import Transcript
from pipelines.batch.store import JobRecord, JobStore
from pipelines.batch.telemetry import AUDIO_SECONDS, JOBS_FINISHED, STEP_SECONDS

log = logging.getLogger(__name__)

DB_NAME = "jobs.sqlite3"


class JobStoreInUse(Exception):
    """Another process (or queue) works on this data directory: two would re-queue each other's jobs."""


class JobStoreUnavailable(Exception):
    """The job database cannot be opened (corrupt file, unwritable directory)."""


class QueueFull(Exception):
    """As many jobs as allowed are queued or running."""


class JobQueue:
    """Jobs in ``data_dir`` (``jobs.sqlite3`` and ``audio/``), worked on by ``workers`` asyncio tasks whose
    blocking steps run on the engine's job threads."""

    def __init__(
        self,
        data_dir: Path,
        engine: TranscriptionEngine,
        *,
        workers: int = 1,
        max_active_jobs: int = 100,
        max_attempts: int = 3,
        max_audio_s: float = 4 * 3600.0,
    ) -> None:
        self.data_dir = data_dir
        self.audio_dir = data_dir / "audio"
        self.engine = engine
        self.store = JobStore(data_dir / DB_NAME)
        self.workers = workers
        self.max_active_jobs = max_active_jobs
        self.max_attempts = max_attempts
        self.max_audio_s = max_audio_s
        self._wakeup = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._in_hand: set[str] = set()  # jobs the workers are running now
        self._lock_file: IO[bytes] | None = None
        self.started = False

    @staticmethod
    def exists(data_dir: Path) -> bool:
        """Whether a job database is there (then the server opens it at start and resumes its jobs)."""
        return (data_dir / DB_NAME).is_file()

    async def start(self) -> None:
        """Open the database, re-queue interrupted jobs, start the workers. Raises JobStoreInUse or
        JobStoreUnavailable (then nothing stays open or locked, so a later call can try again)."""
        self._lock_file = await asyncio.to_thread(_lock_data_dir, self.data_dir)
        try:
            await asyncio.to_thread(self.audio_dir.mkdir, parents=True, exist_ok=True)
            await self.store.open()
            requeued = await self.store.requeue_running()
            if requeued:
                log.info("re-queued %d transcription job(s) interrupted by the last stop", requeued)
            await self._remove_orphan_audio()
        except (sqlite3.Error, OSError) as error:
            await self.store.close()
            self.store = JobStore(self.store.path)  # its thread is gone: a fresh one for the next try
            self._lock_file.close()
            self._lock_file = None
            raise JobStoreUnavailable(f"the transcription job database in {self.data_dir} cannot be used: "
                                      f"{error}") from error
        self._tasks = [asyncio.create_task(self._work(), name=f"transcription-worker-{n}")
                       for n in range(self.workers)]
        self.started = True
        self._wakeup.set()

    async def close(self) -> None:
        """Stop the workers. A job in hand goes back to the queue without using up one of its attempts (a
        graceful stop is not the job's fault; only a process that dies during it counts): it resumes at the next
        start at its first undecoded chunk."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self.started:
            if self._in_hand:
                released = await self.store.release(sorted(self._in_hand))
                log.info("stopping: %d running transcription job(s) back in the queue", released)
                self._in_hand.clear()
            await self.store.close()
        if self._lock_file is not None:
            self._lock_file.close()  # releases the lock
            self._lock_file = None
        self.started = False

    # ------------------------------------------------------------------ the API's side

    def upload_path(self) -> Path:
        """A fresh path for an incoming upload (moved under the job's id once accepted)."""
        return self.audio_dir / f"upload-{secrets.token_hex(8)}.part"

    async def check_capacity(self) -> None:
        active = await self.store.count_active()
        if active >= self.max_active_jobs:
            raise QueueFull(f"{active} transcription jobs are queued or running (limit {self.max_active_jobs})")

    async def submit(self, upload: Path, *, filename: str, duration: float, model: str, language: str | None,
                     prompt: str | None) -> JobRecord:
        """Queue a validated upload as a job (the file is moved under the job's id). Raises QueueFull."""
        await self.check_capacity()
        job_id = f"trjob_{secrets.token_hex(12)}"
        audio_path = self.audio_dir / f"{job_id}.audio"
        await asyncio.to_thread(upload.rename, audio_path)
        job = JobRecord(
            id=job_id, status="queued", created_at=time.time(), started_at=None, finished_at=None,
            filename=filename, audio_path=str(audio_path), model=model, language=language, prompt=prompt,
            duration=duration, detected_language=None, chunks_total=None, chunks_done=0, attempts=0, error=None,
        )
        try:
            inserted = await self.store.insert(job, self.max_active_jobs)
        except BaseException:
            audio_path.unlink(missing_ok=True)
            raise
        if not inserted:  # others were submitted since the check above
            await _remove(str(audio_path))
            raise QueueFull(f"the transcription queue is full (limit {self.max_active_jobs} queued or running)")
        self._wakeup.set()
        return job

    async def get(self, job_id: str) -> JobRecord | None:
        return await self.store.get(job_id)

    async def list(self, status: str | None = None, limit: int = 100) -> list[JobRecord]:
        return await self.store.list(status, limit)

    async def result(self, job: JobRecord) -> Transcript:
        segments = await self.store.segments(job.id)
        return Transcript(language=job.detected_language or job.language or "en", duration=job.duration,
                          segments=tuple(segments))

    async def cancel(self, job_id: str) -> JobRecord | None:
        job = await self.store.cancel(job_id)
        if job is not None and job.status == "cancelled":
            JOBS_FINISHED.labels(status="cancelled").inc()
            await _remove(job.audio_path)
        return job

    async def delete(self, job_id: str) -> JobRecord | None:
        """Forget a job (cancelling it if active) and its audio."""
        job = await self.store.delete(job_id)
        if job is not None:
            await _remove(job.audio_path)
        return job

    # ------------------------------------------------------------------ workers

    async def _work(self) -> None:
        while True:
            try:
                job = await self._next_job()
                if job is not None:
                    await self._process(job)
            except asyncio.CancelledError:
                raise  # the server is stopping: a job in hand stays 'running' and is re-queued at the next start
            except Exception:  # the database failed (disk full, I/O error): keep the worker alive and retry
                log.exception("transcription worker cannot use the job queue; retrying")
                await asyncio.sleep(5.0)

    async def _process(self, job: JobRecord) -> None:
        self._in_hand.add(job.id)
        try:
            await self._run(job)
        except AudioDecodeError as error:
            await self._fail(job, f"cannot decode the audio: {error}")
        except Exception as error:
            log.exception("transcription job %s failed", job.id)
            await self._fail(job, f"internal error: {type(error).__name__}: {error}")
        self._in_hand.discard(job.id)  # skipped when cancelled (the server stopping): close() releases it

    async def _next_job(self) -> JobRecord | None:
        """Claim the oldest queued job, or wait for a submission (then None: look again)."""
        job = await self.store.claim_next(self.max_attempts)
        if job is None:
            self._wakeup.clear()
            job = await self.store.claim_next(self.max_attempts)  # a submit between the claim and the clear
            if job is None:
                await self._wakeup.wait()
        return job

    async def _fail(self, job: JobRecord, message: str) -> None:
        if await self.store.finish(job.id, "failed", message):
            JOBS_FINISHED.labels(status="failed").inc()
        await _remove(job.audio_path)

    async def _run(self, job: JobRecord) -> None:
        model = await self.engine.model()
        started = time.perf_counter()
        audio = await self.engine.job_step(decode_audio_file, Path(job.audio_path), self.max_audio_s)
        plan = await self.store.stored_plan(job.id)
        if not plan:
            planned = await self.store.set_plan(
                job.id, await self.engine.job_step(model.plan, audio, self.engine.max_chunk_s))
            if planned is None:
                log.info("job %s was cancelled or deleted; stopping it", job.id)
                return
            plan = planned
        pending = await self.store.pending_chunks(job.id)
        if len(pending) < len(plan):
            log.info("job %s resumes: %d of %d chunks already done", job.id, len(plan) - len(pending), len(plan))
        batch_size = self.engine.batch_size
        for first in range(0, len(pending), batch_size):
            batch = pending[first:first + batch_size]
            step_started = time.perf_counter()
            per_chunk, language = await self.engine.job_step(
                model.transcribe_chunks, audio, [chunk for _, chunk in batch], job.language, batch_size, job.prompt,
                0.0, self.engine.max_cue_s)
            STEP_SECONDS.labels(path="job").observe(time.perf_counter() - step_started)
            saved = await self.store.save_chunks(
                job.id, {index: segments for (index, _), segments in zip(batch, per_chunk, strict=True)}, language)
            if not saved:
                log.info("job %s was cancelled or deleted; stopping it", job.id)
                return
        if await self.store.finish(job.id, "completed"):
            JOBS_FINISHED.labels(status="completed").inc()
            AUDIO_SECONDS.labels(path="job").inc(job.duration)
            elapsed = time.perf_counter() - started
            log.info("job %s completed: %.1f s of audio in %.1f s", job.id, audio.size / SAMPLE_RATE, elapsed)
            await _remove(job.audio_path)  # the result is in the database; the audio is not needed any more

    async def _remove_orphan_audio(self) -> None:
        """Uploads whose job was never recorded (the server stopped in between), or whose job has ended."""
        keep = {f"{job_id}.audio" for job_id in await self.store.active_ids()}

        def remove() -> None:
            for path in self.audio_dir.iterdir():
                if path.name not in keep:
                    with contextlib.suppress(OSError):
                        shutil.rmtree(path) if path.is_dir() else path.unlink()

        await asyncio.to_thread(remove)


async def _remove(path: str) -> None:
    def remove() -> None:
        with contextlib.suppress(OSError):
            Path(path).unlink()
    await asyncio.to_thread(remove)


def _lock_data_dir(data_dir: Path) -> IO[bytes]:
    """An exclusive advisory lock on ``data_dir`` for as long as the returned file stays open (the kernel drops
    it when the process dies, so a killed server never leaves a stale lock)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    lock_file = (data_dir / "lock").open("wb")
    try:
        fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock_file.close()
        raise JobStoreInUse(f"another Vigil process is using the transcription jobs in {data_dir} "
                            "(set transcription.data_dir to a directory of its own)") from None
    return lock_file
