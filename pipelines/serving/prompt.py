"""The prompt stage: render the system message from a Jinja2 template, then fit the context window.

Priority when the window is short: the system message > the most recent messages > context documents, with
``max_tokens`` reserved for the answer. Tokens are counted by the served model's own tokenizer and chat template
(``LanguageModel.count_tokens``), so what fits here fits there. Counting blocks (a local round trip): run
``fit`` in a thread. It costs one count when everything fits, a few (binary searches) when not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment

from models.llm import ChatMessage
from pipelines.serving.cache import stable_hash


class PromptTooLong(ValueError):
    """Even the system message and the last message do not fit next to the reserved output tokens."""


@dataclass(frozen=True)
class FittedPrompt:
    messages: list[ChatMessage]
    prompt_tokens: int
    dropped_messages: int
    dropped_documents: int


def _largest_fitting(low: int, high: int, fits: Callable[[int], bool]) -> int:
    """Largest n in [low, high] with fits(n), given fits(low) and that fits is monotone (true, then false)."""
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


class PromptBuilder:
    def __init__(self, system_template: str, model_templates: dict[str, str] | None = None) -> None:
        # Sandboxed: templates come from the config, but the documents and system text they render are the
        # client's; StrictUndefined turns a misspelt variable into an error instead of silent empty text.
        env = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=False)
        self._default = env.from_string(system_template)
        self._per_model = {model: env.from_string(source) for model, source in (model_templates or {}).items()}
        # Part of every cache key: a changed template must not serve answers made with the old one.
        self.fingerprint = stable_hash([system_template, model_templates or {}])[:16]

    def system_text(self, model: str, client_system: str, documents: list[str]) -> str:
        template = self._per_model.get(model, self._default)
        return template.render(system=client_system, documents=documents, model=model).strip()

    def fit(
        self,
        *,
        model: str,
        messages: list[ChatMessage],
        documents: list[str],
        count_tokens: Callable[[list[ChatMessage]], int],
        context_window: int,
        reserve_output: int,
    ) -> FittedPrompt:
        client_system = "\n\n".join(m.content for m in messages if m.role == "system")
        conversation = [m for m in messages if m.role != "system"]
        budget = context_window - reserve_output
        if not conversation:
            raise PromptTooLong("messages must include at least one user or assistant message")
        if budget <= 0:
            raise PromptTooLong(
                f"max_tokens ({reserve_output}) leaves no room for the prompt in the context window "
                f"({context_window} tokens)"
            )

        def build(kept_messages: int, kept_documents: int) -> list[ChatMessage]:
            system = self.system_text(model, client_system, documents[:kept_documents])
            head = [ChatMessage("system", system)] if system else []
            return head + conversation[len(conversation) - kept_messages:]

        counts: dict[tuple[int, int], int] = {}

        def tokens(kept_messages: int, kept_documents: int) -> int:
            key = (kept_messages, kept_documents)
            if key not in counts:
                counts[key] = count_tokens(build(kept_messages, kept_documents))
            return counts[key]

        every_message, every_document = len(conversation), len(documents)
        if tokens(every_message, every_document) <= budget:  # the usual case: one count
            return FittedPrompt(build(every_message, every_document), counts[(every_message, every_document)], 0, 0)
        minimum = tokens(1, 0)
        if minimum > budget:
            raise PromptTooLong(
                f"the prompt needs {minimum} tokens with only the system message and the last message, but the "
                f"context window ({context_window} tokens) minus max_tokens ({reserve_output}) leaves {budget}; "
                "shorten the last message or lower max_tokens"
            )
        kept = _largest_fitting(1, every_message, lambda n: tokens(n, 0) <= budget)
        if kept > 1 and conversation[-kept].role == "assistant":  # start the kept history at a user turn
            kept -= 1
        documents_kept = _largest_fitting(0, every_document, lambda n: tokens(kept, n) <= budget)
        return FittedPrompt(
            build(kept, documents_kept), tokens(kept, documents_kept), every_message - kept,
            every_document - documents_kept,
        )
