"""Live transcription of the turn being spoken: partial transcripts while the user speaks (the word prefix two
consecutive decodes agree on), an early decode the moment the user goes quiet, and the final transcript at the
end of the turn, reusing the early or the last partial decode when no speech followed it. Whisper runs on the
engine's STT thread; every decode is a task, so VAD and turn taking never wait for it.

Partials go ahead to the speculator (a prompt warm-up, or a speculative reply on one stable for
``prefill_stable_ms``), and an early decode starts a speculative reply (``pipelines.voice.speculation``)."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np

from models.stt import SpeechToText
from pipelines.protocol import Transcript
from pipelines.voice.config import VoiceLoopConfig
from pipelines.voice.endpointing import MAX_PAUSE_MS, TurnEnded, TurnTaking, sounds_unfinished
from pipelines.voice.outbox import Outbox
from pipelines.voice.speculation import Speculator
from pipelines.voice.turns import Turn, normalise

log = logging.getLogger(__name__)

# How long the turn check waits for the early decode of the same speech, to see whether its words can end a turn.
UNFINISHED_CHECK_WAIT_S = 0.3


def agreed_prefix(previous: str, current: str) -> str:
    """The words two consecutive decodes agree on: stable enough to show (or to prefill with)."""
    agreed = []
    for a, b in zip(previous.split(), current.split(), strict=False):
        if normalise(a) != normalise(b):
            break
        agreed.append(b)
    return " ".join(agreed)


@dataclass(frozen=True, slots=True)
class Decode:
    """A transcription of the turn so far and how many speech frames it covered: if the turn ends with no more
    speech, it is the final transcript."""

    speech_frames: int
    task: asyncio.Task[str]


@dataclass(frozen=True, slots=True)
class Decodes:
    """What a turn that just ended may reuse as its final transcript."""

    early: Decode | None
    partial: tuple[int, str] | None  # (speech frames, text) of the last partial decode


class LiveTranscription:
    """The transcripts of the turn being spoken (``start`` .. ``end``); partials go out through ``outbox``."""

    def __init__(self, stt: SpeechToText, executor: Executor, config: VoiceLoopConfig, turns: TurnTaking,
                 speculator: Speculator, outbox: Outbox) -> None:
        self._stt, self._executor = stt, executor
        self._partial_interval_ms = config.partial_interval_ms
        self._prefill, self._prefill_stable_ms = config.prefill, config.prefill_stable_ms
        self._turns, self._speculator, self._send = turns, speculator, outbox.send
        self._turn: Turn | None = None  # the turn being spoken
        self._partial_task: asyncio.Task[None] | None = None
        # Decodes of the turn so far, reused as the final transcript when no speech followed them.
        self._early: Decode | None = None  # started as soon as the user went quiet (streaming prefill)
        self._last_partial: tuple[int, str] | None = None
        self._last_partial_at = 0.0
        self._last_decode = ""  # the previous partial decode, to agree with
        self._shown_partial = ""
        self._stable_since: float | None = None

    async def transcribe(self, audio: np.ndarray) -> str:
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(self._executor, self._stt.transcribe_live, audio)
        return result.text

    def start(self, turn: Turn) -> None:
        self._turn = turn
        self._last_decode, self._shown_partial, self._stable_since = "", "", None
        self._early, self._last_partial = None, None
        self._last_partial_at = time.perf_counter()

    def on_frame(self, turn: Turn) -> None:
        """A frame inside the turn: decode early when the user just went quiet, else a partial when one is due
        (not in a pause after an early decode: nothing new to decode)."""
        if self._prefill and self._turns.went_quiet:
            self._decode_early(turn)
        elif self._turns.speaking or self._early is None:
            self._maybe_partial(turn)

    def end(self, *, truncated: bool) -> Decodes:
        """The turn ended: stop its partials and hand over what the final transcript may reuse."""
        self._turn = None
        if self._partial_task is not None:
            self._partial_task.cancel()
        early, self._early = self._early, None
        partial, self._last_partial = self._last_partial, None
        return Decodes(None, None) if truncated else Decodes(early, partial)

    async def final(self, turn: Turn, ended: TurnEnded, decodes: Decodes) -> str:
        """The turn's final text: the early or last partial decode if nothing but silence followed it, else a new
        decode of the whole turn."""
        early, partial = decodes.early, decodes.partial
        if early is not None and early.speech_frames == ended.speech_frames:
            text = (await early.task).strip()  # nothing but silence came after it: it is the final text
            turn.metrics.final_decode = "early"
        elif partial is not None and partial[0] == ended.speech_frames:
            text = partial[1]
            turn.metrics.final_decode = "partial"
        else:
            if early is not None:
                early.task.cancel()
            text = (await self.transcribe(ended.audio)).strip()
            turn.metrics.final_decode = "new"
        return text

    def _early_of(self, speech_frames: int) -> Decode | None:
        """The early decode of this very speech (``speech_frames`` of the turn), if one was started."""
        early = self._early
        return early if early is not None and early.speech_frames == speech_frames else None

    async def early_decoded(self, speech_frames: int, timeout: float) -> None:
        """Wait, at most ``timeout`` seconds, for the early decode of this very speech: when it is done, the
        speculation it started is under way. At once when there is none."""
        early = self._early_of(speech_frames)
        if early is not None and timeout > 0:
            await asyncio.wait({early.task}, timeout=timeout)

    async def sounds_unfinished(self, speech_frames: int) -> bool:
        """Whether the words so far cannot end a turn ("Could you tell me?"), which the turn model may hear as
        finished: then the turn stays open up to the silence cap. Uses the decode of this very speech (the early
        one, waited for briefly, else the last partial); without one the model decides alone."""
        early = self._early_of(speech_frames)
        text: str | None = None
        if early is not None:
            done, _ = await asyncio.wait({early.task}, timeout=UNFINISHED_CHECK_WAIT_S)
            if done and not early.task.cancelled() and early.task.exception() is None:
                text = early.task.result()
        elif self._last_partial is not None and self._last_partial[0] == speech_frames:
            text = self._last_partial[1]
        return text is not None and sounds_unfinished(text)

    def tasks(self) -> list[asyncio.Task[None] | asyncio.Task[str] | None]:
        return [self._partial_task, self._early.task if self._early else None]

    def close(self) -> None:
        self._partial_task = self._early = self._turn = None

    def _decode_early(self, turn: Turn) -> None:
        """The user just went quiet: decode the turn now, during the end-of-turn silence. If no speech follows,
        this is the final transcript (the rest is silence) and its reply is already being prepared."""
        if self._early is not None:
            self._early.task.cancel()
        speech_frames = self._turns.speech_frames
        audio = self._turns.endpointer.turn_audio(MAX_PAUSE_MS)
        task = asyncio.create_task(self.transcribe(audio), name="voice:early-decode")
        self._early = Decode(speech_frames, task)

        def speculate(done: asyncio.Task[str]) -> None:
            if done.cancelled() or done.exception() is not None or self._turn is not turn:
                return
            if self._early is not None and self._early.task is done and self._turns.speech_frames == speech_frames:
                text = done.result().strip()
                if text:
                    self._show_partial(turn, text)
                    self._speculator.start(turn, text, in_pause=True)

        task.add_done_callback(speculate)

    def _show_partial(self, turn: Turn, text: str) -> None:
        if text != self._shown_partial:
            self._shown_partial, self._stable_since = text, time.perf_counter()
            self._send(Transcript, turn=turn.number, text=text, final=False)

    def _maybe_partial(self, turn: Turn) -> None:
        now = time.perf_counter()
        # Not beside a prompt warm-up either: on a shared CPU the two slow each other (both took 2-3x longer).
        warming = self._speculator.warming
        busy = any(task is not None and not task.done() for task in (self._partial_task, warming))
        if busy or (now - self._last_partial_at) * 1000.0 < self._partial_interval_ms:
            return
        self._last_partial_at = now
        self._partial_task = asyncio.create_task(
            self._partial(turn, self._turns.endpointer.turn_audio(MAX_PAUSE_MS), self._turns.speech_frames))

    async def _partial(self, turn: Turn, audio: np.ndarray, speech_frames: int) -> None:
        try:
            text = (await self.transcribe(audio)).strip()
        except Exception:
            log.exception("partial transcription failed")
            return
        if self._turn is not turn:
            return  # the turn ended meanwhile; its final transcript supersedes this one
        self._last_partial = (speech_frames, text)
        previous, self._last_decode = self._last_decode, text
        agreed = agreed_prefix(previous, text)
        # Once the user went quiet, the early decode of all of it is what goes ahead (nothing to read ahead).
        ahead = self._prefill and self._early_of(self._turns.speech_frames) is None
        if agreed and agreed != self._shown_partial:
            self._show_partial(turn, agreed)
            if ahead:
                self._speculator.partial(turn, agreed, stable=False)
        elif agreed and self._stable_since is not None and ahead:
            if (time.perf_counter() - self._stable_since) * 1000.0 >= self._prefill_stable_ms:
                self._speculator.partial(turn, agreed, stable=True)
