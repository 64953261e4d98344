"""Prometheus metrics of batch transcription (served with the others on ``/metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

AUDIO_SECONDS = Counter("vigil_transcribed_audio_seconds_total", "Audio seconds transcribed, by path.",
                        ["path"])  # path: request (answered in the request) or job
JOBS_FINISHED = Counter("vigil_transcription_jobs_total", "Transcription jobs that ended, by status.", ["status"])
STEP_SECONDS = Histogram("vigil_transcription_step_seconds", "Wall time of one batched decode step.", ["path"],
                         buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
