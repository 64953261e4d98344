"""``transcription``: ``/v1/audio/transcriptions`` and its persisted batch jobs."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from server.config.base import Section


class TranscriptionSettings(Section):
    """OpenAI-compatible transcription (``/v1/audio/transcriptions``) and its persisted batch-job queue."""

    enabled: bool = True
    model_dir: str | None = Field(
        None, description="Whisper for uploads and jobs (own instance, apart from the live one); None: models.stt."
    )
    cpu_threads: int = Field(2, ge=1, le=64, description="CTranslate2 threads per decode call of the batch model.")
    data_dir: Path = Field(Path("data/transcription"), description="Job database (SQLite) and uploaded audio.")
    workers: int = Field(1, ge=1, le=32, description="Jobs decoded at once (threads of the batch worker pool).")
    batch_size: int = Field(8, ge=1, le=64, description="Chunks decoded per batched call (and per saved step).")
    max_chunk_s: float = Field(30.0, ge=2, le=30, description="Longest chunk cut at VAD pauses (Whisper: 30 s).")
    max_upload_bytes: int = Field(25 * 1024 * 1024, ge=1024, description="Largest direct upload.")
    max_request_audio_s: float = Field(600.0, gt=0, description="Longest audio for a direct request; use jobs.")
    max_pending_requests: int = Field(8, ge=1, description="Direct requests waiting or running; more get 503.")
    max_job_upload_bytes: int = Field(512 * 1024 * 1024, ge=1024, description="Largest upload for a job.")
    max_job_audio_s: float = Field(4 * 3600.0, gt=0, description="Longest audio for a job.")
    max_active_jobs: int = Field(100, ge=1, description="Queued + running jobs; beyond it submissions get 503.")
    max_attempts: int = Field(3, ge=1, description="Starts of one job (restarts included) before it is failed.")
    nice: int = Field(10, ge=0, le=19, description="Lower CPU priority of the batch threads (live turns first).")
    model_aliases: list[str] = Field(
        default_factory=lambda: ["whisper-1"], description="Model names accepted besides the loaded model's own."
    )
    max_cue_s: float = Field(6.0, ge=1, le=30, description="Longest segment / subtitle cue (cut at word times).")
