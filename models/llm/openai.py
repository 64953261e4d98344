"""``backend: openai``: OpenAI-compatible upstreams (vLLM, llama.cpp's server, ...) behind one router (``router``;
each upstream is streamed by ``openai_chat.OpenAiLlm``); a plain ``base_url`` is one upstream that serves any model
name. The router holds HTTP sessions and a health-check task on the app's event loop, so each app builds its own
(``per_app``) and closes it. This module is also the boundary from the config to the router's own dataclasses:
every field is passed by name (``tests/unit/test_llm_routing_config.py`` fails when a field exists on one side
only)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from models.llm import LANGUAGE_MODELS, LanguageModel
from models.llm.openai_chat import FinalMessage
from models.llm.router import ANY_MODEL, RoutedLlm, RoutingConfig, UpstreamConfig
from models.packaged import ModelNotAvailable
from models.registry import BackendConfig

FINAL_MESSAGE = ("How it goes on from a last assistant message: no (the default: taken as a finished turn), vllm "
                 "(sent continue_final_message), llama.cpp (its server does by itself). With every upstream able "
                 "to, the voice loop gives yes-or-no questions about people in view their first word "
                 "(voice.scene_lead).")


class _Part(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LlmUpstream(_Part):
    name: str = Field(min_length=1, description="Label in metrics and logs; unique.")
    base_url: str = Field(min_length=1, description="e.g. http://vllm-0:8000/v1")
    models: list[str] = Field(
        default_factory=list, description="Model ids it serves; empty: whatever its GET /v1/models lists."
    )
    api_key: SecretStr | None = None
    cost: float = Field(1.0, ge=0, description="Relative cost; cost-aware routing prefers cheaper among equals.")
    context_window: int = Field(4096, ge=256)
    final_message: FinalMessage = Field("no", description=FINAL_MESSAGE)


class LlmRouting(_Part):
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


class OpenAiLlmConfig(BackendConfig):
    backend: Literal["openai"] = "openai"
    base_url: str | None = Field(None, description="OpenAI-compatible upstream, e.g. a vLLM server.")
    model: str = Field("smollm2-135m-instruct", description="The model name clients ask for (and the plain "
                       "base_url upstream is asked for).")
    api_key: SecretStr | None = None
    final_message: FinalMessage = Field("no", description="The plain base_url upstream: " + FINAL_MESSAGE)
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


@LANGUAGE_MODELS.register(OpenAiLlmConfig, per_app=True)
def build(config: OpenAiLlmConfig) -> LanguageModel:
    if not config.base_url and not config.upstreams:
        raise ModelNotAvailable("models.llm.backend is 'openai' but neither models.llm.base_url nor "
                                "models.llm.upstreams is set")
    return RoutedLlm(upstream_configs(config), config.model, routing_config(config.routing))


def routing_config(routing: LlmRouting) -> RoutingConfig:
    """``models.llm.routing`` -> the router's strategy and timings. The two have the same fields, all plain values
    (``tests/unit/test_llm_routing_config.py``), so each is passed by its own name: a field on the config side only
    is a TypeError here, one on the router's side only fails that test."""
    return RoutingConfig(**routing.model_dump())


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value else None


def upstream_configs(llm: OpenAiLlmConfig) -> list[UpstreamConfig]:
    """``models.llm`` -> the router's upstreams; a plain ``base_url`` is one upstream serving any model name,
    first."""
    upstreams = [
        UpstreamConfig(
            name=u.name, base_url=u.base_url, models=tuple(u.models), api_key=_secret(u.api_key), cost=u.cost,
            context_window=u.context_window, final_message=u.final_message,
        )
        for u in llm.upstreams
    ]
    if llm.base_url:
        upstreams.insert(0, UpstreamConfig(name="default", base_url=llm.base_url, models=(ANY_MODEL,),
                                           api_key=_secret(llm.api_key), final_message=llm.final_message))
    return upstreams
