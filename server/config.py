"""The one validated configuration tree.

Precedence (highest first): CLI flags > environment (``VIGIL_<SECTION>__<KEY>``) > config file (YAML or TOML)
> defaults. Every knob of the server lives here; other modules receive the parts they need.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from pipelines.protocol import LineConfig, SessionConfig, ZoneConfig

REPO_ROOT = Path(__file__).resolve().parent.parent


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ServerSettings(Section):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(256 * 1024, ge=1024, description="Largest accepted HTTP request body.")
    web_root: Path = Field(REPO_ROOT / "web", description="Directory the dashboard is served from.")
    shutdown_timeout_s: float = Field(5.0, gt=0)


class AuthSettings(Section):
    token: SecretStr | None = Field(
        None, description="When set, every API endpoint needs 'Authorization: Bearer <token>' (or ?token=)."
    )


class IceServer(Section):
    urls: list[str]
    username: str | None = None
    credential: SecretStr | None = None


class WebRTCSettings(Section):
    host_addresses: list[str] = Field(
        default_factory=list,
        description="Host addresses ICE may offer (e.g. ['127.0.0.1']); empty: every non-loopback address.",
    )
    ice_servers: list[IceServer] = Field(
        default_factory=list, description="STUN/TURN servers. Empty by default: no public server is contacted."
    )
    max_message_bytes: int = Field(64 * 1024, ge=256, description="Largest accepted data-channel message.")
    connect_timeout_s: float = Field(30.0, gt=0, description="A session whose peer never connects is closed.")


class SessionLimits(Section):
    max_sessions: int = Field(16, ge=1, description="Concurrent WebRTC sessions.")
    max_sources: int = Field(16, ge=1, description="Concurrent server-side sources.")
    metrics_interval_s: float = Field(1.0, gt=0, description="Period of per-session 'metrics' messages.")
    outbound_queue_messages: int = Field(
        1000, ge=10, description="Messages buffered per subscriber before a slow consumer is disconnected."
    )
    audio_queue_frames: int = Field(500, ge=10, description="Audio frames buffered per session (backpressure).")


class SourcesSettings(Section):
    media_root: Path = Field(Path("media"), description="The only directory file replay may read.")
    rtsp_transport: Literal["tcp", "udp"] = "tcp"
    open_timeout_s: float = Field(10.0, gt=0)
    read_timeout_s: float = Field(5.0, gt=0)
    reconnect_initial_s: float = Field(0.5, gt=0)
    reconnect_max_s: float = Field(30.0, gt=0)


class VideoSettings(Section):
    target_fps: float = Field(5.0, gt=0, le=120, description="Default analysis rate; sessions may change it.")
    max_batch: int = Field(8, ge=1, description="Frames per batched inference call across streams.")
    max_wait_ms: float = Field(10.0, ge=0, description="How long the batcher waits to fill a batch.")
    zones: list[ZoneConfig] = Field(default_factory=list, description="Default zones for every session/source.")
    lines: list[LineConfig] = Field(default_factory=list, description="Default counting lines.")


class VoiceSettings(Section):
    enabled: bool = True
    vad_threshold: float = Field(0.5, gt=0, lt=1)
    min_speech_ms: int = Field(250, ge=32, description="Speech needed before a turn starts (a cough is shorter).")
    end_of_turn_silence_ms: int = Field(600, ge=64, description="Silence that ends a turn (hangover).")
    max_turn_s: float = Field(30.0, gt=0, description="A longer turn is cut and answered (error turn_too_long).")
    partial_interval_ms: int = Field(400, ge=100, description="How often the growing turn is re-decoded.")
    prefill: bool = Field(
        True, description="Streaming prefill: decode the turn as soon as the user goes quiet (or on a stable "
        "partial) and start the LLM then, during the end-of-turn silence; redone if the user goes on speaking."
    )
    prefill_stable_ms: int = Field(300, ge=0, description="How long a partial must be stable to prefill on it.")
    barge_in: bool = True
    barge_in_min_speech_ms: int = Field(200, ge=32, description="User speech that interrupts a reply.")
    echo_gating: Literal["auto", "on", "off"] = Field(
        "auto", description="Ignore VAD while our reply plays; auto: on for RTSP/file sources (no echo cancelling)."
    )
    system_prompt: str = (
        "You are Vigil, a concise assistant that can see through the user's camera. "
        "Answer in one or two short sentences."
    )
    max_reply_tokens: int = Field(96, ge=1, le=4096)
    memory_tokens: int = Field(1024, ge=64, description="Prompt budget: older exchanges are dropped beyond it.")
    temperature: float = Field(0.0, ge=0, le=2)
    silent_track_s: float = Field(10.0, gt=0, description="Digital silence this long is reported (audio_silent).")


class DetectorModel(Section):
    backend: Literal["yolo", "opencv-ssd", "none"] = Field(
        "yolo", description="'none': no detector; sessions only count frames."
    )
    weights: str | None = Field(None, description="Path or name; None: the packaged yolo11n-pose.pt.")
    device: str = "cpu"
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    half: bool = False
    classes: list[int] | None = None


class SttModel(Section):
    model_dir: str | None = Field(
        None, description="CTranslate2 Whisper directory, or 'base' (packaged parts); None: packaged tiny.en."
    )
    device: str = "cpu"
    compute_type: str = "int8"


class LlmUpstream(Section):
    name: str = Field(min_length=1, description="Label in metrics and logs; unique.")
    base_url: str = Field(min_length=1, description="e.g. http://vllm-0:8000/v1")
    models: list[str] = Field(
        default_factory=list, description="Model ids it serves; empty: whatever its GET /v1/models lists."
    )
    api_key: SecretStr | None = None
    cost: float = Field(1.0, ge=0, description="Relative cost; cost-aware routing prefers cheaper among equals.")
    context_window: int = Field(4096, ge=256)


class LlmRouting(Section):
    strategy: Literal["least-connections", "least-latency", "model-affinity", "cost-aware"] = "least-connections"
    saturation: int = Field(
        4, ge=1, description="cost-aware: in-flight requests at which an upstream counts as saturated."
    )
    health_interval_s: float = Field(5.0, gt=0, description="Period of GET /v1/models health checks.")
    health_timeout_s: float = Field(2.0, gt=0)
    request_timeout_s: float = Field(30.0, gt=0, description="Connecting, and each wait for the next chunk.")
    latency_alpha: float = Field(0.3, gt=0, le=1, description="Weight of the newest TTFT in its moving average.")
    max_attempts: int = Field(3, ge=1, description="Upstreams tried for one request that fails before its "
                              "first token.")
    affinity_conversations: int = Field(10000, ge=1, description="Conversations model-affinity remembers (LRU).")
    probe_interval_s: float = Field(0.5, gt=0, description="When no upstream is eligible, ejected ones are "
                                    "health-checked at once, each at most this often.")


class LlmModel(Section):
    backend: Literal["embedded", "openai"] = "embedded"
    model_path: str | None = Field(None, description="GGUF file for the embedded backend.")
    base_url: str | None = Field(None, description="OpenAI-compatible upstream, e.g. a vLLM server.")
    model: str = "smollm2-135m-instruct"
    api_key: SecretStr | None = None
    # openai backend: several upstreams behind one router (models/router.py); a plain base_url is one upstream.
    upstreams: list[LlmUpstream] = Field(
        default_factory=list, description="OpenAI-compatible upstreams (e.g. vLLM replicas) the router picks from."
    )
    routing: LlmRouting = LlmRouting()

    @field_validator("upstreams")
    @classmethod
    def _unique_upstream_names(cls, value: list[LlmUpstream]) -> list[LlmUpstream]:
        names = [upstream.name for upstream in value]
        if len(names) != len(set(names)):
            raise ValueError(f"upstream names must be unique, got {names}")
        return value


class TtsModel(Section):
    backend: Literal["piper", "espeak"] = "piper"
    voice: str | None = Field(None, description="Piper .onnx voice; None: the packaged voice.")


class ModelsSettings(Section):
    detector: DetectorModel = DetectorModel()
    stt: SttModel = SttModel()
    llm: LlmModel = LlmModel()
    tts: TtsModel = TtsModel()



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


class SpeechSettings(Section):
    """OpenAI-compatible ``/v1/audio/speech`` with the configured TTS backend (``models.tts``)."""

    enabled: bool = True
    max_input_chars: int = Field(4096, ge=1)
    max_pending_requests: int = Field(8, ge=1, description="Requests waiting or running; more get 503.")
    model_aliases: list[str] = Field(
        default_factory=lambda: ["tts-1", "tts-1-hd", "gpt-4o-mini-tts"],
        description="Model names accepted besides the backend's own.",
    )
    voices: list[str] = Field(
        default_factory=lambda: ["alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                                 "shimmer", "verse", "marin", "cedar"],
        description="Voice names accepted (all speak with the configured voice), besides the backend's own.",
    )

class GrpcSettings(Section):
    enabled: bool = Field(True, description="Serve the gRPC InferenceService beside HTTP, in the same process.")
    host: str = "127.0.0.1"
    port: int = Field(50051, ge=0, le=65535, description="0: any free port.")
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=1024, description="Largest message either way.")
    keepalive_time_s: float = Field(30.0, gt=0, description="Ping an idle connection this often.")
    keepalive_timeout_s: float = Field(10.0, gt=0, description="Drop a connection whose ping goes unanswered.")
    max_concurrent_rpcs: int = Field(64, ge=1, description="RPCs served at once; more get RESOURCE_EXHAUSTED.")
    max_conversations: int = Field(8, ge=1, description="Concurrent Converse streams (each runs a voice loop).")
    max_audio_s: float = Field(120.0, gt=0, description="Longest StreamInput audio (RESOURCE_EXHAUSTED beyond).")
    max_tokens_limit: int = Field(4096, ge=1, description="Largest max_tokens a request may ask for.")
    outbound_queue_messages: int = Field(
        1000, ge=10, description="Converse messages buffered for a slow client before the call is ended."
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="VIGIL_", env_nested_delimiter="__", extra="forbid", validate_assignment=True
    )

    server: ServerSettings = ServerSettings()
    auth: AuthSettings = AuthSettings()
    webrtc: WebRTCSettings = WebRTCSettings()
    sessions: SessionLimits = SessionLimits()
    sources: SourcesSettings = SourcesSettings()
    video: VideoSettings = VideoSettings()
    voice: VoiceSettings = VoiceSettings()
    models: ModelsSettings = ModelsSettings()
    api: ApiSettings = Field(default_factory=lambda: ApiSettings())
    redis: RedisSettings = Field(default_factory=lambda: RedisSettings())
    transcription: TranscriptionSettings = TranscriptionSettings()
    speech: SpeechSettings = SpeechSettings()
    grpc: GrpcSettings = GrpcSettings()

    @field_validator("sources")
    @classmethod
    def _backoff_order(cls, value: SourcesSettings) -> SourcesSettings:
        if value.reconnect_max_s < value.reconnect_initial_s:
            raise ValueError("reconnect_max_s must be >= reconnect_initial_s")
        return value

    def session_defaults(self) -> SessionConfig:
        return SessionConfig.model_validate(
            {"video": self.video.model_dump(include={"target_fps", "zones", "lines"})}
        )

    def masked(self) -> dict[str, Any]:
        """The effective config as JSON-able data, secrets shown as '**********'."""
        return json.loads(self.model_dump_json())


class ConfigError(Exception):
    """A configuration value is wrong; the message names the key."""


def _format_validation_error(error: ValidationError) -> str:
    lines = []
    for item in error.errors():
        key = ".".join(str(part) for part in item["loc"]) or "<root>"
        lines.append(f"{key}: {item['msg']} (got {item.get('input')!r})")
    return "invalid configuration:\n  " + "\n  ".join(lines)


def load_settings(config_file: Path | str | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Build the settings tree: file < environment < overrides (CLI flags, nested dicts)."""
    file_source: type[PydanticBaseSettingsSource] | None = None
    if config_file is not None:
        path = Path(config_file)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        if path.suffix in (".yaml", ".yml"):
            file_source = YamlConfigSettingsSource
        elif path.suffix == ".toml":
            file_source = TomlConfigSettingsSource
        else:
            raise ConfigError(f"config file must be .yaml, .yml or .toml: {path}")

    class _Loaded(Settings):
        @classmethod
        def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings,
                                       file_secret_settings):  # type: ignore[override]
            sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
            if file_source is YamlConfigSettingsSource:
                sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=config_file))
            elif file_source is TomlConfigSettingsSource:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=config_file))
            return tuple(sources)

    try:
        loaded = _Loaded(**(overrides or {}))
    except ValidationError as error:
        raise ConfigError(_format_validation_error(error)) from None
    except (ValueError, OSError) as error:  # unreadable or unparsable file
        raise ConfigError(f"cannot read config file {config_file}: {error}") from None
    return loaded


# ---------------------------------------------------------------- OpenAI-compatible API (/v1/*)


class RateLimit(Section):
    requests: int = Field(ge=1, description="Requests allowed per sliding window.")
    window_s: float = Field(60.0, gt=0, description="Length of the sliding window.")


class ApiKey(Section):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[\w.-]+$", description="Shown in logs and metrics.")
    key: SecretStr = Field(description="The bearer token clients send.")
    rate_limit: RateLimit | None = Field(None, description="This key's own limit; None: api.rate_limit.")


class ChatCacheSettings(Section):
    exact: bool = Field(True, description="Answer a repeated deterministic request from the cache.")
    semantic: bool = Field(True, description="Answer a paraphrased question from the cache (embeddings).")
    semantic_threshold: float = Field(0.9, gt=0, le=1, description="Cosine similarity for a semantic hit.")
    ttl_s: float = Field(3600.0, gt=0, description="How long a cached answer lives.")
    max_entries: int = Field(1024, ge=1, description="Entries kept per cache (oldest evicted first).")
    cache_sampled: bool = Field(False, description="Also cache requests with temperature > 0.")


DEFAULT_SYSTEM_TEMPLATE = (
    "{{ system }}"
    "{% if documents %}{% if system %}\n\n{% endif %}Use these reference documents when they help:"
    "{% for doc in documents %}\n[{{ loop.index }}] {{ doc }}{% endfor %}{% endif %}"
)


class PromptSettings(Section):
    system_template: str = Field(
        DEFAULT_SYSTEM_TEMPLATE,
        description="Jinja2 template of the system message; variables: system (the client's system messages), "
        "documents (context documents that fit), model. An empty result sends no system message.",
    )
    model_templates: dict[str, str] = Field(default_factory=dict, description="Per served model: its own template.")
    max_context_documents: int = Field(16, ge=0, description="Context documents accepted per request.")

    @field_validator("system_template")
    @classmethod
    def _template_compiles(cls, value: str) -> str:
        _check_jinja(value)
        return value

    @field_validator("model_templates")
    @classmethod
    def _model_templates_compile(cls, value: dict[str, str]) -> dict[str, str]:
        for template in value.values():
            _check_jinja(template)
        return value


def _check_jinja(source: str) -> None:
    from jinja2 import TemplateSyntaxError
    from jinja2.sandbox import SandboxedEnvironment

    try:
        SandboxedEnvironment().parse(source)
    except TemplateSyntaxError as error:
        raise ValueError(f"not a valid Jinja2 template: {error}") from None


class ContentFilterSettings(Section):
    enabled: bool = True
    mask_pii: list[Literal["email", "phone", "kr_rrn"]] = Field(
        default_factory=lambda: ["email", "phone", "kr_rrn"], description="PII kinds masked in generated text."
    )
    block_patterns: list[str] = Field(
        default_factory=list, description="Regular expressions; generated text matching one ends the answer "
        "(finish_reason 'content_filter') before the match is sent."
    )
    max_hold_chars: int = Field(256, ge=16, description="Longest text held back while it may still become PII.")

    @field_validator("block_patterns")
    @classmethod
    def _patterns_compile(cls, value: list[str]) -> list[str]:
        import regex

        for pattern in value:
            try:
                regex.compile(pattern)
            except regex.error as error:
                raise ValueError(f"block pattern {pattern!r} is not a valid regular expression: {error}") from None
        return value


class ApiSettings(Section):
    keys: list[ApiKey] = Field(
        default_factory=list, description="API keys for /v1/*; empty: auth.token (if set) guards /v1/* too."
    )
    rate_limit: RateLimit | None = Field(
        RateLimit(requests=120, window_s=60.0), description="Per-key sliding window; None: unlimited."
    )
    chat: bool = Field(True, description="Serve /v1/chat/completions and /v1/models.")
    served_models: list[str] = Field(
        default_factory=list, description="Model names clients may ask for; empty: [models.llm.model]. With "
        "models.llm.upstreams, added to the union of the upstreams' models."
    )
    preload: bool = Field(False, description="Load the chat models at start-up instead of on the first request.")
    max_messages: int = Field(64, ge=1)
    max_message_chars: int = Field(32_000, ge=1)
    max_output_tokens: int = Field(1024, ge=1, description="Upper bound of a request's max_tokens.")
    default_max_tokens: int = Field(256, ge=1, description="max_tokens when a request gives none.")
    max_in_flight: int = Field(32, ge=1, description="Concurrent generations; more are answered 503 with Retry-After.")
    cache: ChatCacheSettings = ChatCacheSettings()
    prompt: PromptSettings = PromptSettings()
    content_filter: ContentFilterSettings = ContentFilterSettings()
    disconnect_poll_s: float = Field(
        0.1, gt=0, le=5, description="How often in-flight chat requests are checked for a client that went away "
        "(its generation is then cancelled)."
    )


class RedisSettings(Section):
    url: SecretStr | None = Field(
        None, description="e.g. redis://127.0.0.1:6379/0 (may hold a password); when set, API rate limits and "
        "caches live in Redis and are shared by every Vigil process using it."
    )
    key_prefix: str = Field("vigil:", description="Prefix of every key Vigil writes.")
