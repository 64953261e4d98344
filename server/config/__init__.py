"""The one validated configuration tree, a module per section.

Precedence (highest first): CLI flags > environment (``VIGIL_<SECTION>__<KEY>``) > config file (YAML or TOML)
> defaults. Every knob of the server lives here; other modules receive the parts they need. A new section is a
new module here plus one field on ``Settings``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
    YamlConfigSettingsSource,
)

from pipelines.errors import describe_validation_error
from pipelines.protocol import SessionConfig
from server.config.api import DEFAULT_SYSTEM_TEMPLATE, ApiKey, ApiSettings, RateLimit
from server.config.auth import AuthSettings
from server.config.base import REPO_ROOT, Section
from server.config.cluster import ClusterSettings
from server.config.grpc import GrpcSettings
from server.config.mcp import McpSettings
from server.config.memory import MemorySettings
from server.config.models import (
    DetectorModel,
    LlmModel,
    LlmRouting,
    LlmUpstream,
    ModelsSettings,
    SttModel,
    TtsModel,
)
from server.config.mqtt import MqttSettings
from server.config.redis import RedisSettings
from server.config.server import ServerSettings
from server.config.sessions import SessionLimits
from server.config.sources import SourcesSettings
from server.config.speech import SpeechSettings
from server.config.storage import AppearRule, StorageSettings
from server.config.transcription import TranscriptionSettings
from server.config.video import VideoSettings
from server.config.voice import VoiceSettings
from server.config.webrtc import IceServer, WebRTCSettings

__all__ = [
    "DEFAULT_SYSTEM_TEMPLATE",
    "REPO_ROOT",
    "ApiKey",
    "ApiSettings",
    "AppearRule",
    "AuthSettings",
    "ClusterSettings",
    "ConfigError",
    "DetectorModel",
    "GrpcSettings",
    "IceServer",
    "LlmModel",
    "LlmRouting",
    "LlmUpstream",
    "McpSettings",
    "MemorySettings",
    "ModelsSettings",
    "MqttSettings",
    "RateLimit",
    "RedisSettings",
    "Section",
    "ServerSettings",
    "SessionLimits",
    "Settings",
    "SourcesSettings",
    "SpeechSettings",
    "StorageSettings",
    "SttModel",
    "TranscriptionSettings",
    "TtsModel",
    "VideoSettings",
    "VoiceSettings",
    "WebRTCSettings",
    "load_settings",
]


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
    # Built at load, not import: the default detector depends on the machine (models.detectors), and a config
    # that names its detector's backend never imports openvino to find it.
    models: ModelsSettings = Field(default_factory=ModelsSettings)
    api: ApiSettings = ApiSettings()
    redis: RedisSettings = RedisSettings()
    transcription: TranscriptionSettings = TranscriptionSettings()
    speech: SpeechSettings = SpeechSettings()
    grpc: GrpcSettings = GrpcSettings()
    storage: StorageSettings = StorageSettings()
    cluster: ClusterSettings = ClusterSettings()
    memory: MemorySettings = MemorySettings()
    mqtt: MqttSettings = MqttSettings()
    mcp: McpSettings = McpSettings()

    @field_validator("sources")
    @classmethod
    def _backoff_order(cls, value: SourcesSettings) -> SourcesSettings:
        if value.reconnect_max_s < value.reconnect_initial_s:
            raise ValueError("reconnect_max_s must be >= reconnect_initial_s")
        return value

    @model_validator(mode="after")
    def _grpc_token_limit_is_the_api_limit(self) -> Settings:
        alias = self.grpc.max_tokens_limit
        if alias is not None:
            if "max_output_tokens" in self.api.model_fields_set and self.api.max_output_tokens != alias:
                raise ValueError("grpc.max_tokens_limit is an alias of api.max_output_tokens: set only the latter")
            self.api.max_output_tokens = alias
        return self

    def session_defaults(self) -> SessionConfig:
        return SessionConfig.model_validate(
            {"video": self.video.model_dump(include={"target_fps", "zones", "lines", "motion", "objects"})}
        )

    def masked(self) -> dict[str, Any]:
        """The effective config as JSON-able data, secrets shown as '**********'."""
        return json.loads(self.model_dump_json())


class ConfigError(Exception):
    """A configuration value is wrong; the message names the key."""


def _format_validation_error(error: ValidationError) -> str:
    return "invalid configuration:\n  " + describe_validation_error(error, root="<root>", with_values=True,
                                                                     separator="\n  ", limit=None)


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
