"""``backend: embedded``: a GGUF chat model in this process on xllamacpp (the packaged SmolLM2 by default)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from models.llm_backends import LANGUAGE_MODELS
from models.registry import BackendConfig

if TYPE_CHECKING:
    from models.llm import LanguageModel


class EmbeddedLlmConfig(BackendConfig):
    backend: Literal["embedded"] = "embedded"
    model_path: str | None = Field(None, description="GGUF file; None: the packaged SmolLM2-135M-Instruct.")
    model: str = Field("smollm2-135m-instruct", description="The model name clients ask for.")
    threads: int | None = Field(
        None, ge=1, description="Generation threads; None: half the cores, so the voice loop's other models keep "
        "the rest (prompt processing always uses every core)."
    )


@LANGUAGE_MODELS.register(EmbeddedLlmConfig)
def build(config: EmbeddedLlmConfig) -> LanguageModel:
    from models.llm import EmbeddedLlm

    return EmbeddedLlm(config.model_path, n_threads=config.threads)
