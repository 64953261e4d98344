"""``api``: the OpenAI-compatible ``/v1`` endpoints (keys, rate limits, cache, prompt, content filter)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, field_validator

from server.config.base import Section


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
