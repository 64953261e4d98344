"""OpenAI-compatible audio endpoints: ``/v1/audio/transcriptions`` (direct, for short files), asynchronous
transcription jobs (``/v1/audio/transcriptions/jobs``, persisted, for long or many files) and
``/v1/audio/speech``. Errors are ``ApiError``s, rendered in OpenAI's shape by the app's error middleware;
auth is the /v1 ingress (``server.v1.ingress``).

The models load on first use (the batch Whisper instance and the TTS voice), apart from the live sessions'.
"""

from __future__ import annotations

import asyncio
import logging
import math
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError
from pydantic import BaseModel, ConfigDict, Field

from pipelines.batch.decode import AudioDecodeError, AudioTooLong
from pipelines.batch.engine import EngineBusy
from pipelines.batch.formats import CONTENT_TYPES, RESPONSE_FORMATS, Transcript, as_json, as_text
from pipelines.batch.jobs import JobQueue, QueueFull
from pipelines.batch.store import JobRecord
from pipelines.errors import ApiError, parse_number
from pipelines.speech import CONTENT_TYPES as SPEECH_CONTENT_TYPES
from pipelines.speech import SpeechBusy
from server.config import Settings
from server.engines import Engines
from server.http.errors import parser_error_reason, read_json_body
from server.v1.audio_services import AUDIO, AudioServices
from server.v1.ingress import MULTIPART_FIELD_BYTES as MAX_FIELD_BYTES

log = logging.getLogger(__name__)

RETRY_AFTER_S = 5
TRANSCRIPTION_FIELDS = frozenset({"file", "model", "language", "prompt", "response_format", "temperature",
                                  "timestamp_granularities", "timestamp_granularities[]", "stream"})
JOB_FIELDS = frozenset({"file", "model", "language", "prompt"})


def _busy(message: str) -> ApiError:
    return ApiError("server_busy", f"{message}; retry later", retry_after_s=RETRY_AFTER_S)


# ---------------------------------------------------------------- multipart uploads


@dataclass
class Upload:
    path: Path | BinaryIO | None = None  # where the 'file' part went
    filename: str = "audio"
    size: int = 0
    fields: dict[str, list[str]] = field(default_factory=dict)

    def one(self, name: str) -> str | None:
        values = self.fields.get(name)
        if values and len(values) > 1:
            raise ApiError("invalid_request", f"'{name}' is given {len(values)} times", param=name)
        return values[0] if values else None


async def _read_upload(request: web.Request, destination: Path | BinaryIO, limit: int,
                       allowed: frozenset[str]) -> Upload:
    """Stream a multipart form to disk (the 'file' part, into a path or an open file) and memory (the other
    fields), enforcing ``limit``."""
    if not request.content_type.startswith("multipart/form-data"):
        raise ApiError("invalid_request",
                       "send the audio as multipart/form-data with a 'file' part and a 'model' field")
    # a declared size over the limit was refused by the /v1 ingress already; a chunked body is counted here
    upload = Upload()
    try:
        reader = await request.multipart()
        async for part in reader:
            if not isinstance(part, BodyPartReader):
                raise ApiError("invalid_request", "nested multipart bodies are not accepted")
            name = part.name or ""
            if name not in allowed:
                raise ApiError("unknown_parameter", f"unknown parameter '{name}'", param=name)
            if name == "file":
                if upload.path is not None:
                    raise ApiError("invalid_request", "send one 'file' per request", param="file")
                upload.filename = Path(part.filename or "audio").name[:255] or "audio"
                upload.size = await _save_part(part, destination, limit)
                upload.path = destination
            else:
                upload.fields.setdefault(name, []).append(await _read_field(part, name))
                if sum(len(v) for values in upload.fields.values() for v in values) > MAX_FIELD_BYTES:
                    raise ApiError("invalid_request", f"the form fields add up to more than {MAX_FIELD_BYTES} bytes")
    except HttpProcessingError as error:  # a bad part header (InvalidHeader): its reason, not the raw bytes
        raise ApiError("invalid_request", "malformed multipart/form-data body: "
                       + parser_error_reason(error.message, error)) from None
    except (ValueError, AssertionError, web.HTTPException) as error:
        # aiohttp reports other malformed multipart bodies with these
        raise ApiError("invalid_request", f"malformed multipart/form-data body: {error}") from None
    if upload.path is None:
        raise ApiError("invalid_request", "the 'file' part is missing", param="file")
    return upload


async def _save_part(part: BodyPartReader, destination: Path | BinaryIO, limit: int) -> int:
    size = 0
    pending = bytearray()
    out: BinaryIO = await asyncio.to_thread(destination.open, "wb") if isinstance(destination, Path) else destination
    try:
        while chunk := await part.read_chunk(1 << 16):
            size += len(chunk)
            if size > limit:
                raise ApiError("file_too_large", f"the upload is larger than the limit of {limit} bytes", param="file")
            pending += chunk
            if len(pending) >= 1 << 20:  # write in big pieces, off the event loop
                await asyncio.to_thread(out.write, bytes(pending))
                pending.clear()
        await asyncio.to_thread(out.write, bytes(pending))
    finally:
        if isinstance(destination, Path):
            await asyncio.to_thread(out.close)
    if size == 0:
        raise ApiError("invalid_request", "the uploaded file is empty", param="file")
    return size


async def _read_field(part: BodyPartReader, name: str) -> str:
    data = bytearray()
    while chunk := await part.read_chunk(8192):
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise ApiError("invalid_request", f"'{name}' is longer than {MAX_FIELD_BYTES} bytes", param=name)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ApiError("invalid_request", f"'{name}' is not UTF-8 text", param=name) from None


class _TemporaryUpload:
    """An anonymous temporary file for a direct request's upload: it has no name on disk, so nothing is left
    behind however the request or the server ends (even killed)."""

    async def __aenter__(self) -> BinaryIO:
        self.file: BinaryIO = await asyncio.to_thread(tempfile.TemporaryFile, prefix="vigil-upload-")
        return self.file

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.to_thread(self.file.close)


# ---------------------------------------------------------------- transcription parameters


@dataclass(frozen=True)
class TranscriptionParams:
    model: str
    language: str | None
    prompt: str | None
    response_format: str
    temperature: float
    word_timestamps: bool = False


async def _transcription_params(services: AudioServices, upload: Upload) -> TranscriptionParams:
    model_name = upload.one("model")
    if not model_name:
        raise ApiError("invalid_request", "'model' is required (e.g. 'whisper-1')", param="model")
    try:
        model = await services.engine.model()
    except Exception as error:  # a model that cannot load is the server's problem, not the client's
        log.exception("batch transcription model failed to load")
        raise ApiError("model_unavailable", f"the transcription model is not available: {error}") from None
    accepted = [*services.settings.transcription.model_aliases, model.name]
    if model_name not in accepted:
        raise ApiError("model_not_found", f"model '{model_name}' is not served here; use one of {accepted}",
                       param="model", kind="bad_request")
    language = upload.one("language") or None
    try:
        model.check_language(language)
    except ValueError as error:
        raise ApiError("unsupported_language", str(error), param="language") from None
    prompt = upload.one("prompt") or None
    response_format = upload.one("response_format") or "json"
    if response_format not in RESPONSE_FORMATS:
        raise ApiError("invalid_request",
                       f"response_format must be one of {list(RESPONSE_FORMATS)}, not '{response_format}'",
                       param="response_format")
    temperature = 0.0
    if (raw := upload.one("temperature")) is not None:
        temperature = parse_number("temperature", raw, minimum=0.0, maximum=1.0, code="invalid_request")
    granularities = upload.fields.get("timestamp_granularities[]", []) + upload.fields.get(
        "timestamp_granularities", [])
    if any(g not in ("segment", "word") for g in granularities):
        raise ApiError("invalid_request",
                       f"timestamp_granularities takes 'segment' and 'word', not {granularities}",
                       param="timestamp_granularities")
    if granularities and response_format != "verbose_json":
        raise ApiError("invalid_request", "timestamp_granularities needs response_format 'verbose_json'",
                       param="timestamp_granularities")
    if (upload.one("stream") or "false").lower() not in ("false", "0"):
        raise ApiError("invalid_request", "streamed transcription is not available; omit 'stream'", param="stream")
    return TranscriptionParams(model_name, language, prompt, response_format, temperature, "word" in granularities)


def _transcript_response(transcript: Transcript, response_format: str, words: bool = False) -> web.Response:
    body = as_json(transcript, response_format, words=words)
    if body is not None:
        if response_format == "json":
            body["usage"] = {"type": "duration", "seconds": math.ceil(transcript.duration)}
        return web.json_response(body)
    return web.Response(text=as_text(transcript, response_format), content_type=CONTENT_TYPES[response_format],
                        charset="utf-8")


# ---------------------------------------------------------------- handlers: direct transcription


async def create_transcription(request: web.Request) -> web.StreamResponse:
    services = request.app[AUDIO]
    config = services.settings.transcription
    async with _TemporaryUpload() as path:
        upload = await _read_upload(request, path, config.max_upload_bytes, TRANSCRIPTION_FIELDS)
        await asyncio.to_thread(path.flush)
        params = await _transcription_params(services, upload)
        try:
            transcript = await services.engine.transcribe_file(
                path, language=params.language, prompt=params.prompt, temperature=params.temperature,
                max_seconds=config.max_request_audio_s)
        except AudioTooLong as error:
            raise ApiError("audio_too_long", f"{error}; submit it as a job: POST /v1/audio/transcriptions/jobs",
                           param="file") from None
        except AudioDecodeError as error:
            raise ApiError("invalid_audio", f"the uploaded file is not usable audio: {error}", param="file") from None
        except EngineBusy as busy:
            raise _busy(str(busy)) from None
    return _transcript_response(transcript, params.response_format, params.word_timestamps)


# ---------------------------------------------------------------- handlers: jobs


def _job_body(job: JobRecord, transcript: Transcript | None = None) -> dict[str, Any]:
    total = job.chunks_total
    fraction = 1.0 if job.status == "completed" else (job.chunks_done / total if total else 0.0)
    body: dict[str, Any] = {
        "id": job.id,
        "object": "transcription.job",
        "status": job.status,
        "created_at": int(job.created_at),
        "started_at": int(job.started_at) if job.started_at else None,
        "finished_at": int(job.finished_at) if job.finished_at else None,
        "filename": job.filename,
        "model": job.model,
        "language": job.language,
        "duration": round(job.duration, 3),
        "attempts": job.attempts,
        "progress": {"chunks_done": job.chunks_done, "chunks_total": total,
                     "audio_seconds_done": round(job.audio_seconds_done, 3), "fraction": round(fraction, 4)},
        "error": {"message": job.error} if job.error else None,
    }
    if transcript is not None:
        body["result"] = as_json(transcript, "verbose_json")
    return body


async def create_transcription_job(request: web.Request) -> web.StreamResponse:
    services = request.app[AUDIO]
    config = services.settings.transcription
    jobs = await services.started_jobs()
    try:
        await jobs.check_capacity()  # before taking a possibly large upload
        path = jobs.upload_path()
        try:
            upload = await _read_upload(request, path, config.max_job_upload_bytes, JOB_FIELDS)
            params = await _transcription_params(services, upload)
            duration = await services.engine.probe(path, config.max_job_audio_s)
            job = await jobs.submit(path, filename=upload.filename, duration=duration, model=params.model,
                                    language=params.language, prompt=params.prompt)
        finally:
            await asyncio.to_thread(path.unlink, True)  # moved away when the job was accepted
    except QueueFull as full:
        raise _busy(str(full)) from None
    except EngineBusy as busy:
        raise _busy(str(busy)) from None
    except AudioTooLong as error:
        raise ApiError("audio_too_long", str(error), param="file") from None
    except AudioDecodeError as error:
        raise ApiError("invalid_audio", f"the uploaded file is not usable audio: {error}", param="file") from None
    return web.json_response(_job_body(job), status=202)


async def _job_or_404(request: web.Request) -> tuple[JobQueue, JobRecord]:
    jobs = await request.app[AUDIO].started_jobs()
    job_id = request.match_info["job_id"]
    job = await jobs.get(job_id)
    if job is None:
        raise ApiError("job_not_found", f"no transcription job '{job_id}'")
    return jobs, job


async def get_transcription_job(request: web.Request) -> web.StreamResponse:
    jobs, job = await _job_or_404(request)
    transcript = await jobs.result(job) if job.status == "completed" else None
    return web.json_response(_job_body(job, transcript))


async def get_transcription_job_result(request: web.Request) -> web.StreamResponse:
    jobs, job = await _job_or_404(request)
    response_format = request.query.get("response_format", "json")
    if response_format not in RESPONSE_FORMATS:
        raise ApiError("invalid_request", f"response_format must be one of {list(RESPONSE_FORMATS)}",
                       param="response_format")
    if job.status != "completed":
        raise ApiError("job_not_completed", f"job '{job.id}' is {job.status}; its result is ready when it is completed")
    return _transcript_response(await jobs.result(job), response_format)


async def list_transcription_jobs(request: web.Request) -> web.StreamResponse:
    jobs = await request.app[AUDIO].started_jobs()
    status = request.query.get("status")
    if status is not None and status not in ("queued", "running", "completed", "failed", "cancelled"):
        raise ApiError("invalid_request", f"unknown status '{status}'", param="status")
    limit = parse_number("limit", request.query.get("limit", "100"), integer=True, minimum=1, maximum=1000,
                         code="invalid_request")
    records = await jobs.list(status, limit)
    return web.json_response({"object": "list", "data": [_job_body(job) for job in records]})


async def cancel_transcription_job(request: web.Request) -> web.StreamResponse:
    jobs, job = await _job_or_404(request)
    if not job.active:
        raise ApiError("job_not_active", f"job '{job.id}' is already {job.status}")
    cancelled = await jobs.cancel(job.id)
    if cancelled is None:  # deleted meanwhile
        raise ApiError("job_not_found", f"no transcription job '{job.id}'")
    if cancelled.status != "cancelled":  # it ended meanwhile
        raise ApiError("job_not_active", f"job '{job.id}' is already {cancelled.status}")
    return web.json_response(_job_body(cancelled))


async def delete_transcription_job(request: web.Request) -> web.StreamResponse:
    jobs, job = await _job_or_404(request)
    await jobs.delete(job.id)
    return web.json_response({"id": job.id, "object": "transcription.job.deleted", "deleted": True})


# ---------------------------------------------------------------- handlers: speech


class SpeechRequest(BaseModel):
    # Strict, as OpenAI is (and /v1/chat/completions): "speed": "1.5" or true is a 400, not a coerced number.
    model_config = ConfigDict(extra="forbid", strict=True)
    model: str = Field(min_length=1)
    input: str = Field(min_length=1)
    voice: str | dict[str, Any]
    instructions: str | None = Field(None, description="Accepted and ignored: the voices here take no direction.")
    response_format: Literal["mp3", "opus", "aac", "flac", "wav", "pcm"] = "mp3"
    speed: float = Field(1.0, ge=0.25, le=4.0)
    stream_format: Literal["audio", "sse"] = "audio"


async def create_speech(request: web.Request) -> web.StreamResponse:
    services = request.app[AUDIO]
    config = services.settings.speech
    body = await read_json_body(request, SpeechRequest)
    if not body.input.strip():
        raise ApiError("invalid_request", "input has nothing to say (only whitespace)", param="input")
    if len(body.input) > config.max_input_chars:
        raise ApiError("invalid_request", f"input is longer than {config.max_input_chars} characters", param="input")
    if body.stream_format == "sse":
        raise ApiError("invalid_request", "stream_format 'sse' is not available; use 'audio'", param="stream_format")
    try:
        speech = await services.speech()
    except Exception as error:
        log.exception("TTS failed to load")
        raise ApiError("model_unavailable", f"the speech model is not available: {error}") from None
    models = [*config.model_aliases, speech.tts.name]
    if body.model not in models:
        raise ApiError("model_not_found", f"model '{body.model}' is not served here; use one of {models}",
                       param="model", kind="bad_request")
    voices = [*config.voices, speech.tts.name]
    if not isinstance(body.voice, str) or body.voice not in voices:
        raise ApiError("invalid_request", f"voice must be one of {voices} (custom voices are not available)",
                       param="voice")
    try:
        audio = await speech.speak(body.input, body.response_format, body.speed)
    except SpeechBusy as busy:
        raise _busy(str(busy)) from None
    return web.Response(body=audio, content_type=SPEECH_CONTENT_TYPES[body.response_format])


# ---------------------------------------------------------------- wiring


def build_audio(settings: Settings, engines: Engines) -> AudioServices | None:
    """The audio services, when transcription or speech is enabled (models load on first use)."""
    if not (settings.transcription.enabled or settings.speech.enabled):
        return None
    return AudioServices.from_settings(settings, engines)


def mount_audio(app: web.Application, settings: Settings, services: AudioServices | None) -> None:
    """Jobs resumed on start-up, the services closed on shutdown. (The routes: ``server.v1.routes``.)"""
    if services is None:
        return

    async def resume_jobs(app: web.Application) -> None:
        # Jobs left by the last run (even a killed one) continue now, without waiting for a request.
        if settings.transcription.enabled and JobQueue.exists(settings.transcription.data_dir):
            try:
                await services.started_jobs()
            except ApiError as in_use:  # the server still serves everything else; job requests get this 503
                log.error("transcription jobs not resumed: %s", in_use.message)

    async def close(app: web.Application) -> None:
        await services.close()

    app.on_startup.append(resume_jobs)
    app.on_shutdown.append(close)
