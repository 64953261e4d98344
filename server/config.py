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
