"""``models``: the detector, STT, LLM (and its router) and TTS backends."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from models.detectors import DETECTORS
from server.config.base import Section

# The union of the registered detector backends' configs, discriminated by ``backend`` (default yolo): a new
# backend is one module in models/detector_backends/ and nothing here changes.
DetectorModel = DETECTORS.config_type()


class SttModel(Section):
    model_dir: str | None = Field(
        None, description="CTranslate2 Whisper directory, or 'base' (packaged parts); None: packaged tiny.en."
    )
    device: str = "cpu"
    compute_type: str = "int8"
    short_window: bool = Field(
        True, description="Live voice turns: decode a window fitted to the utterance (speech + 7.5 s, at least "
        "10 s) instead of Whisper's 30 s, ~4x less encoder work; a degenerate decode is redone on 30 s."
    )


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
    detector: DetectorModel = Field(default_factory=DETECTORS.default_config)
    stt: SttModel = SttModel()
    llm: LlmModel = LlmModel()
    tts: TtsModel = TtsModel()
