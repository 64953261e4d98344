"""Reply streaming: LLM text deltas -> the sentence guard -> speech chunks (the first clause alone, then whole
sentences) -> TTS on its own thread -> the reply track. Deltas are sent as they come; a speculative reply
(``pipelines.voice.speculation``) holds its deltas and its first audio, ready, until its turn confirms it. A
reply never starts over the user: its first audio waits until they are quiet."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from concurrent.futures import Executor

import numpy as np

from models.llm import LanguageModel, LlmRequest, LlmUnavailable
from models.tts import TextToSpeech
from pipelines.protocol import Reply
from pipelines.voice.audio import ReplyAudioTrack, resample_pcm, trim_silence
from pipelines.voice.metrics import ms_since
from pipelines.voice.outbox import Outbox
from pipelines.voice.replies import ReplyGuard
from pipelines.voice.sentences import ends_sentence, may_end_inside_sentence, speakable, split_reply
from pipelines.voice.speculation import Speculation
from pipelines.voice.turns import Turn

log = logging.getLogger(__name__)

CLAUSE_PAUSE_MS = 120  # the pause kept after a clause spoken on its own (Piper ends every chunk with ~200 ms)
WORD_CUT_PAUSE_MS = 40  # ... and after a chunk cut between two words, where a comma's pause sounds like a stumble


async def after_lead(lead: str, deltas: AsyncIterator[str]) -> AsyncGenerator[str, None]:
    """A continued reply as it is spoken: ``lead`` (the text the LLM went on from) out with the first delta, so the
    reply's timing stays the LLM's (its first token), with a space between them unless the LLM gave one."""
    async for delta in deltas:
        if lead:
            delta, lead = lead + ("" if delta[:1].isspace() else " ") + delta, ""
        yield delta
    if lead:  # the LLM added nothing
        yield lead


def pause_after(chunk: str) -> float | None:
    """The silence kept after a chunk that may end inside a sentence: a sentence's own (None: Piper's, whole),
    a clause's, or a short one after a cut between words."""
    if ends_sentence(chunk):
        return None
    return CLAUSE_PAUSE_MS if chunk.rstrip()[-1:] in ",;:-–—" else WORD_CUT_PAUSE_MS


class ReplyStreamer:
    """Speaks replies onto ``track``, its messages through ``outbox``; ``user_quiet`` is set while the user does
    not hold the floor."""

    def __init__(self, llm: LanguageModel, tts: TextToSpeech, tts_executor: Executor, track: ReplyAudioTrack,
                 outbox: Outbox, *, max_sentences: int, user_quiet: asyncio.Event) -> None:
        self._llm, self._tts, self._tts_executor, self._track = llm, tts, tts_executor, track
        self._max_sentences = max_sentences
        self._user_quiet, self._outbox = user_quiet, outbox
        self._send, self._error = outbox.send, outbox.error
        self.last_request: LlmRequest | None = None  # what the LLM was last asked (tests and debugging)
        self.last_reply_stop: str | None = None  # why the ReplyGuard cut the last answer ("repeat", "sentences")

    async def stream(self, turn: Turn, request: LlmRequest, canned: str | None,
                     speculation: Speculation | None) -> str | None:
        """Stream the reply to ``request`` (or the ``canned`` text): its text deltas out as they come, speech
        chunk by chunk. Returns the reply's text, or None when it failed (told to the client as an ``error``);
        every reply the client saw begin also ends (``done``, ``interrupted`` when cancelled)."""
        confirmed = speculation.confirmed if speculation is not None else None
        if confirmed is None:
            self.last_request = request
            self.last_reply_stop = None
        started = time.perf_counter()
        reply_text = ""
        buffer = ""
        held: list[str] = []  # deltas not sent yet (speculative reply not yet confirmed)
        spoken = 0
        first_token = True
        guard = ReplyGuard(self._max_sentences)

        def release_deltas() -> None:
            for delta in held:
                self._send(Reply, turn=turn.number, delta=delta)
            held.clear()

        async def hold_until_confirmed() -> None:
            if speculation is not None and not speculation.confirmed.is_set():
                speculation.audio_held.set()
                await speculation.confirmed.wait()
            if speculation is not None:  # confirmed (before or during the wait): this is the turn's answer
                self.last_request = request
            release_deltas()

        async def take(delta: str) -> None:
            """Show and speak what the guard let through: the first clause alone, then whole sentences."""
            nonlocal reply_text, buffer, spoken
            reply_text += delta
            held.append(delta)
            if confirmed is None or confirmed.is_set():
                release_deltas()
            chunks, buffer = split_reply(buffer + delta, spoken)
            for chunk in chunks:
                pcm = await self.synthesize(chunk, first=spoken == 0, clause=may_end_inside_sentence(spoken))
                await hold_until_confirmed()  # a speculative reply's first audio waits here, ready
                await self._play_reply(turn, pcm, first=spoken == 0)
                spoken += 1

        try:
            # Closed on leaving the loop (the guard stopping a loop, a cancel): that ends generation upstream.
            async with contextlib.aclosing(self._deltas(request, canned)) as stream:
                async for token in stream:
                    if first_token:
                        first_token = False
                        turn.metrics.llm_first_token_ms = ms_since(started)
                        if speculation is not None:
                            speculation.prompt_read.set()
                    if delta := guard.push(token):
                        await take(delta)
                    if guard.stopped is not None:
                        if confirmed is None or confirmed.is_set():
                            self.last_reply_stop = guard.stopped
                        log.info("reply of turn %d stopped (%s) after %r", turn.number, guard.stopped, guard.text)
                        break
            if delta := guard.finish():
                await take(delta)
            await hold_until_confirmed()
            if buffer.strip():
                pcm = await self.synthesize(buffer, first=spoken == 0, clause=False)
                await self._play_reply(turn, pcm, first=spoken == 0)
            self._send(Reply, turn=turn.number, done=True)
            return reply_text
        except LlmUnavailable as error:
            if confirmed is not None and not confirmed.is_set():
                await confirmed.wait()  # a speculation reports nothing before its turn is final
            release_deltas()
            self._error("llm_unavailable", str(error))
            self._send(Reply, turn=turn.number, done=True)
        except asyncio.CancelledError:
            if confirmed is None or confirmed.is_set():  # every answer the client saw begin also ends
                release_deltas()
                self._send(Reply, turn=turn.number, done=True, interrupted=True)
            raise
        except Exception as error:
            log.exception("reply failed")
            if confirmed is not None and not confirmed.is_set():
                await confirmed.wait()
            release_deltas()
            self._error("reply_failed", f"the reply failed: {error}")
            self._send(Reply, turn=turn.number, done=True)
        return None

    async def _deltas(self, request: LlmRequest, canned: str | None) -> AsyncGenerator[str, None]:
        if canned is not None:
            yield canned
            return
        # A last assistant message is the reply's first word (pipelines.voice.grounding): the LLM streams only what
        # follows it.
        lead = request.messages[-1].content if request.messages and request.messages[-1].role == "assistant" else ""
        async with contextlib.aclosing(self._llm.stream(request)) as deltas:
            async for delta in after_lead(lead, deltas):
                yield delta

    async def synthesize(self, text: str, *, first: bool, clause: bool) -> np.ndarray:
        """48 kHz speech for one chunk of the reply; the first starts at once (its leading silence cut) and a
        ``clause`` (a chunk that may end inside a sentence) with a short pause, ``pause_after`` it."""
        if self._outbox.virtual:
            return np.zeros(0, np.int16)  # offline replay has nowhere to play audio
        loop = asyncio.get_running_loop()
        tts = self._tts
        pcm = await loop.run_in_executor(self._tts_executor, tts.synthesize, speakable(text))
        pcm = trim_silence(pcm, tts.sample_rate, lead=first, keep_tail_ms=pause_after(text) if clause else None)
        return resample_pcm(pcm, tts.sample_rate)

    async def _play_reply(self, turn: Turn, pcm48: np.ndarray, *, first: bool) -> None:
        """A reply never starts over the user: if they speak when its first audio is ready (they went on after
        a pause), it waits for the speech to end, or for the barge-in that cuts it unheard."""
        if first:
            await self._user_quiet.wait()
        self.play(turn, pcm48)

    def play(self, turn: Turn, pcm48: np.ndarray) -> None:
        if pcm48.size == 0:
            return
        if turn.audio_queued is None:
            turn.audio_queued = time.perf_counter()
            if turn.end_of_speech is not None:
                turn.metrics.first_audio_ms = ms_since(turn.end_of_speech)
        self._track.enqueue(pcm48, turn.number)
