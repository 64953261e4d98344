"""Speculation: a reply started before the end of the turn, on a partial transcript (streaming prefill) or on
the early decode of a pause. It generates and synthesises its first audio, then holds it unheard until the final
transcript confirms it (the same words: it plays at once) or not (discarded, and the reply starts over). Speech
that goes on after the pause it started in discards it too.

Cancelling a queued llama.cpp request does not free its slot until its first token: speculation starts once per
pause, not on every VAD dip, or the real reply would queue behind discarded ones."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

from pipelines import telemetry
from pipelines.voice.metrics import ms_since
from pipelines.voice.turns import Turn, continued, normalise


@dataclass
class Speculation:
    turn: Turn
    text: str
    started: float
    in_pause: bool = False  # started while the user was quiet (else on a stable partial, while speaking)
    task: asyncio.Task[None] | None = None
    confirmed: asyncio.Event = field(default_factory=asyncio.Event)
    audio_held: asyncio.Event = field(default_factory=asyncio.Event)  # its first audio is ready, unheard
    prompt_read: asyncio.Event = field(default_factory=asyncio.Event)  # its LLM gave a first token, or it ended

    def cancel(self) -> None:
        self.prompt_read.set()
        if self.task is not None:
            self.task.cancel()


# The reply a speculation runs: (turn, text, speculation) -> the coroutine that streams it, holding its deltas and
# first audio until ``speculation.confirmed`` is set.
SpeculativeReply = Callable[[Turn, str, Speculation], Coroutine[Any, Any, None]]
# A warm-up: (turn, the question so far) -> the coroutine that has the LLM read that prompt (one token, unheard).
PromptWarmUp = Callable[[Turn, str], Coroutine[Any, Any, None]]


class Speculator:
    """At most one speculative reply at a time (``current``), and at most one prompt warm-up (``warming``).

    While the user speaks, partial transcripts go ahead of the turn (:meth:`partial`). With ``warm_up`` (an LLM
    that keeps its KV cache here: llama.cpp reuses the longest prefix a request shares with the one before),
    each new one has the LLM read the prompt as it stands, for one token nobody hears, so the reply's own request
    later reads only the last words: Qwen 0.5B's first token came after ~90 ms instead of ~130 on this 2-core
    machine. A whole speculation there would also generate and synthesise beside the early decode of the pause
    for a reply the final words nearly always discard (the early decode took 310-340 ms instead of ~150 when one
    did). Without ``warm_up`` (a remote LLM), a partial stable long enough starts a speculation."""

    def __init__(self, reply: SpeculativeReply, warm_up: PromptWarmUp | None = None) -> None:
        self._reply: SpeculativeReply | None = reply
        self._warm_up = warm_up
        self.current: Speculation | None = None
        self.warming: asyncio.Task[None] | None = None
        self.warmed: tuple[int, str] = (0, "")  # (turn number, text) last read ahead (tests, debugging)

    def partial(self, turn: Turn, text: str, *, stable: bool) -> None:
        """A partial transcript of ``turn`` while it is spoken; ``stable``: unchanged for ``prefill_stable_ms``."""
        if self._reply is None or self.current is not None:
            return
        if self._warm_up is None:
            if stable:
                self.start(turn, text)
            return
        if turn.prefix:
            text = continued(turn.prefix, text)
        if (turn.number, text) == self.warmed or (self.warming is not None and not self.warming.done()):
            return  # one at a time: a request queued in llama.cpp holds its slot until it ends
        self.warmed = (turn.number, text)
        self.warming = asyncio.create_task(self._warm_up(turn, text), name="voice:warm-up")

    def start(self, turn: Turn, text: str, *, in_pause: bool = False) -> None:
        self.discard()
        if self._reply is None:
            return  # closed
        if turn.prefix:
            text = continued(turn.prefix, text)
        speculation = Speculation(turn, text, time.perf_counter(), in_pause)
        speculation.task = asyncio.create_task(self._reply(turn, text, speculation), name="voice:speculation")
        self.current = speculation

    def discard(self, turn: Turn | None = None) -> None:
        """Discard the held speculative reply (of ``turn`` only, when given); it was never heard."""
        speculation = self.current
        if speculation is None or (turn is not None and speculation.turn is not turn):
            return
        speculation.cancel()
        self.current = None
        if not speculation.confirmed.is_set():
            speculation.turn.metrics.speculation_discarded()

    def user_resumed(self, turn: Turn) -> None:
        """The user went on after a pause: the reply held since that pause is discarded unheard."""
        speculation = self.current
        if speculation is not None and speculation.in_pause and speculation.turn is turn:
            self.discard()

    def close(self) -> None:
        """Forget the current speculation and warm-up and what they run (the voice loop's: no cycle back to it)."""
        self.current = self._reply = self._warm_up = self.warming = None

    def drop(self) -> None:
        """A barge-in: cancel it without counting it against its turn."""
        if self.current is not None:
            self.current.cancel()
        self.current = None

    async def prompt_read(self, turn: Turn, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, until the LLM has read the prompt of ``turn``'s speculation (its
        first token came); at once when there is none."""
        speculation = self.current
        if speculation is not None and speculation.turn is turn and timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(speculation.prompt_read.wait(), timeout)

    def confirm(self, turn: Turn, text: str) -> asyncio.Task[None] | None:
        """The final transcript of ``turn``: its speculation's reply task, released, when it was started on the
        same words; else None (any speculation of the turn is discarded and the reply starts over)."""
        speculation = self.current if self.current is not None and self.current.turn is turn else None
        if speculation is None:
            return None
        self.current = None
        if normalise(speculation.text) == normalise(text):
            turn.metrics.prefill = "reused"
            turn.metrics.prefill_saved_ms = ms_since(speculation.started)
            turn.metrics.speculation = "played"
            speculation.confirmed.set()
            telemetry.VOICE_PREFILL.labels(outcome="reused").inc()
            return speculation.task
        speculation.cancel()
        turn.metrics.prefill = "restarted"
        turn.metrics.speculation_discarded()
        telemetry.VOICE_PREFILL.labels(outcome="restarted").inc()
        return None
