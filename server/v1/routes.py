"""The ``/v1`` route table: OpenAI's chat and audio endpoints, those the config enables."""

from __future__ import annotations

from server.config import Settings
from server.http.route import Route
from server.v1 import audio as audio_api
from server.v1 import chat as openai_api


def v1_routes(settings: Settings) -> tuple[Route, ...]:
    """The OpenAI-compatible ``/v1`` endpoints the config enables (``api.chat``, ``transcription.enabled``,
    ``speech.enabled``), behind the /v1 ingress (API keys, rate limit)."""
    v1_errors = (400, 401, 404, 413, 429, 503)
    job = "/v1/audio/transcriptions/jobs/{job_id}"
    chat = (
        Route("POST", "/v1/chat/completions", openai_api.chat_completions,
              "Chat completion in OpenAI's shape (Server-Sent Events with stream: true)",
              openai_api.ChatCompletionBody, errors=v1_errors),
        Route("GET", "/v1/models", openai_api.list_models, "The served chat models", errors=(401, 429),
              head=True),
        Route("GET", "/v1/models/{model}", openai_api.get_model, "One served chat model",
              errors=(401, 404, 429), head=True),
    )
    transcription = (
        Route("POST", "/v1/audio/transcriptions", audio_api.create_transcription,
              "Transcribe a short audio file (OpenAI's shape)", errors=v1_errors,
              form_fields=tuple(sorted(audio_api.TRANSCRIPTION_FIELDS))),
        Route("POST", "/v1/audio/transcriptions/jobs", audio_api.create_transcription_job,
              "Queue a long audio file as a persisted batch transcription job", status=202, errors=v1_errors,
              form_fields=tuple(sorted(audio_api.JOB_FIELDS))),
        Route("GET", "/v1/audio/transcriptions/jobs", audio_api.list_transcription_jobs, "List transcription jobs",
              errors=(400, 401, 429, 503), head=True),
        Route("GET", job, audio_api.get_transcription_job, "A transcription job's status and progress",
              errors=(401, 404, 429), head=True),
        Route("GET", job + "/result", audio_api.get_transcription_job_result, "A finished job's transcript",
              errors=(400, 401, 404, 409, 429), head=True),
        Route("POST", job + "/cancel", audio_api.cancel_transcription_job, "Cancel a transcription job",
              errors=(401, 404, 409, 429)),
        Route("DELETE", job, audio_api.delete_transcription_job, "Delete a transcription job and its result",
              errors=(401, 404, 409, 429)),
    )
    speech = (
        Route("POST", "/v1/audio/speech", audio_api.create_speech, "Synthesise speech (OpenAI's shape)",
              audio_api.SpeechRequest, errors=v1_errors, content_type="application/octet-stream"),
    )
    return ((chat if settings.api.chat else ()) + (transcription if settings.transcription.enabled else ())
            + (speech if settings.speech.enabled else ()))
