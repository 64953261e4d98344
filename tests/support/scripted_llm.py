"""Test seam: a LanguageModel that streams a fixed script of chunks, for what the real small model will not say
(PII split across chunk boundaries, a blocked phrase). Named as a fake on purpose; never used outside tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from models.llm import ChatMessage, LlmRequest, TextStream, TokenChunk, Usage


class ScriptedLlmForTest(TextStream):
    def __init__(self, chunks: list[str], name: str = "scripted", context_window: int = 2048,
                 hold: asyncio.Event | None = None, logprob: float | None = None) -> None:
        self.chunks = chunks
        self.logprob = logprob  # reported for every chunk when a request asks for logprobs
        self.hold = hold  # when given, each generation waits for it before its first chunk
        self.started = asyncio.Event()  # set once a generation has begun
        self.name = name
        self.context_window = context_window
        self.requests: list[LlmRequest] = []
        self.closed_early = 0  # generations closed before the script ended

    def count_tokens(self, messages: list[ChatMessage]) -> int:
        return sum(4 + len(m.content.split()) for m in messages)  # a stand-in tokenizer: words

    async def generate(self, request: LlmRequest) -> AsyncIterator[TokenChunk]:
        self.requests.append(request)
        self.started.set()
        finished = False
        try:
            if self.hold is not None:
                await self.hold.wait()
            for text in self.chunks:
                await asyncio.sleep(0)  # a real backend yields to the loop between tokens
                yield TokenChunk(text, self.logprob if request.logprobs else None)
            finished = True
            yield TokenChunk(finish_reason="stop",
                             usage=Usage(self.count_tokens(request.messages), len(self.chunks)))
        finally:
            if not finished:
                self.closed_early += 1

    async def close(self) -> None:
        pass
