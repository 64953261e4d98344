"""Recall: what a turn's prompt remembers. The session's own conversation (trimmed, oldest exchanges first, to
``voice.memory_tokens``) and reminders, and, when memory is on, the app's memory: a ``ContextProvider``
(``pipelines.memory.recall.MemoryRecall``, given by ``server.services``) asked with the user's words before the LLM
is prompted. The prompt says only what the session has (``pipelines.voice.replies``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from models.llm import ChatMessage, LanguageModel, LlmRequest
from pipelines.voice.arithmetic import calculate
from pipelines.voice.config import VoiceLoopConfig
from pipelines.voice.metrics import TurnMetricsBuilder
from pipelines.voice.replies import (
    acknowledge,
    asks_for_reminders,
    recite,
    reminder_request,
    session_prompt,
    turn_messages,
)


@dataclass(frozen=True, slots=True)
class PromptContext:
    """Extra system-prompt text for one turn (e.g. remembered entries) and the turn metrics of finding it."""

    text: str
    memory_retrieval_ms: float | None = None
    memory_entries: int | None = None


# Called with the user's text and the conversation so far, before the LLM is prompted; None adds nothing.
ContextProvider = Callable[[str, list[ChatMessage]], Awaitable[PromptContext | None]]


class Recall:
    def __init__(self, llm: LanguageModel, config: VoiceLoopConfig, memory: ContextProvider | None = None) -> None:
        self.memory = memory
        self._llm, self._config = llm, config
        self.history: list[ChatMessage] = []  # this session's exchanges, oldest first
        self.reminders: list[str] = []  # what the user asked to be reminded of, in this session
        self.last_sum: float | None = None  # the value of the last answer the calculator gave ("Double that.")

    async def request(self, text: str, metrics: TurnMetricsBuilder | None, *, video: bool,
                      scene: str | None, lead: str | None = None, remember: bool = True) -> LlmRequest:
        """The LLM request answering ``text``: the camera only with a video track (a small model repeats
        whatever the prompt says), the ``scene`` only when the question is about it, with the reply's first word
        when the scene decides it (``lead``: ``pipelines.voice.grounding``) and the LLM can go on from it,
        remembered entries (unless not ``remember``: a prompt read ahead of the question's last words)."""
        if not getattr(self._llm, "continues_final_message", False):
            lead = None
        recalled = None
        if self.memory is not None and remember:
            context = await self.memory(text, list(self.history))
            if context is not None:
                recalled = context.text
                if metrics is not None:
                    if context.memory_retrieval_ms is not None:
                        metrics.memory_retrieval_ms = context.memory_retrieval_ms
                    if context.memory_entries is not None:
                        metrics.memory_entries = context.memory_entries
        # The stable part first (llama.cpp reuses its KV cache), what changes per turn after it: turn_messages.
        system, history = session_prompt(self._config.system_prompt, video=video), list(self.history)
        messages = turn_messages(system, history, text, video=video, scene=scene, recalled=recalled, lead=lead)
        # Trim the oldest exchanges until the prompt fits the memory budget (system and question always stay).
        # count_tokens may ask the model's own tokenizer (blocking): keep it off the event loop.
        while history and await asyncio.to_thread(self._llm.count_tokens, messages) > self._config.memory_tokens:
            del history[:2]
            messages = turn_messages(system, history, text, video=video, scene=scene, recalled=recalled, lead=lead)
        return LlmRequest(messages, max_tokens=self._config.max_reply_tokens, temperature=self._config.temperature,
                          repeat_penalty=self._config.repeat_penalty)

    def canned(self, text: str) -> str | None:
        """A reply that needs no LLM: a reminder is acknowledged, "what did I ask you to remember?" is answered
        from this session's reminders (without any, the LLM answers, from memory when it has some), and a sum is
        computed (``pipelines.voice.arithmetic``)."""
        reminder = reminder_request(text)
        if reminder is not None:
            return acknowledge(reminder)
        if self.reminders and asks_for_reminders(text):
            return recite(self.reminders)
        if self._config.calculator and (calculation := calculate(text, self.last_sum)) is not None:
            return calculation.text
        return None

    def answered(self, text: str, reply: str) -> None:
        """A reply was given in full: the next prompts have the exchange, and a reminder is kept."""
        self.history += [ChatMessage("user", text), ChatMessage("assistant", reply.strip())]
        # "that" in a follow-up is this answer's only when the calculator gave it: canned() on the same text
        calculation = calculate(text, self.last_sum) if self._config.calculator else None
        self.last_sum = calculation.value if calculation is not None and calculation.text == reply.strip() else None
        if (reminder := reminder_request(text)) is not None:
            self.reminders.append(reminder)  # the timeline (and so memory) has the request itself

    def announced(self, text: str) -> None:
        """An alert was spoken whole: the next answer's history has it."""
        self.history.append(ChatMessage("assistant", text))
