"""Turn taking: who holds the floor, frame by frame.

:class:`Endpointer` decides from per-frame VAD probabilities: a turn starts after enough speech and ends after
enough silence. The silence that ends a turn on its own is ``end_silence_ms`` (with semantic turn detection, the
cap for a turn the model called unfinished); the voice loop may end a turn sooner with :meth:`Endpointer.end_now`.
:class:`TurnTaking` is the voice loop's part built on it: echo gating while our reply plays, the pause and
resume edges the loop decodes and speculates on, and ``smart-turn``'s question to the turn model (is the user
finished?) after a short silence, checked against the words (:func:`sounds_unfinished`).
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from pipelines.voice.metrics import ms_since

if TYPE_CHECKING:
    from models.turn import TurnDetector
    from pipelines.voice.config import VoiceLoopConfig
    from pipelines.voice.metrics import EndOfTurn, TurnMetricsBuilder

log = logging.getLogger(__name__)

FRAME_SAMPLES = 512  # Silero's frame at 16 kHz: 32 ms
FRAME_MS = FRAME_SAMPLES / 16.0
MAX_PAUSE_MS = 500  # pauses inside a turn are shortened to this before decoding it
# ... and to this for the turn model, the silence it is asked about kept whole. A pause of its own makes Smart Turn
# doubt the finished question after it: "Could you tell me what the weather will be like | tomorrow?" scores 0.96
# whole, 0.11 with a 1 s pause after "like". bench/turn_ends.py, 1 s pauses: questions resumed and ended at the
# first check 60 % -> 74 %, later words ended (a second pause cut off) 36 % -> 45 % (unpaused: 91 % and 66 %).
TURN_MODEL_MAX_PAUSE_MS = 300


@dataclass(slots=True)
class TurnStarted:
    pass


@dataclass(slots=True)
class TurnEnded:
    audio: np.ndarray  # float32 16 kHz, pre-roll included
    truncated: bool  # cut at the maximum turn length
    speech_frames: int  # speech frames the turn held
    silence_ms: float  # trailing silence heard before the turn ended (end of speech = now - silence_ms)


# Audio kept from before the speech run that starts a turn. Silero is often 0.4-0.6 s late on a soft first word
# ("What colour ...": the run began 0.54 s into the speech), and 300 ms lost that word: Whisper heard "Or is the sky?".
PREROLL_MS = 700.0


class Endpointer:
    def __init__(self, *, threshold: float = 0.5, min_speech_ms: float = 250, end_silence_ms: float = 600,
                 max_turn_s: float = 30.0, preroll_ms: float = PREROLL_MS) -> None:
        self.threshold = threshold
        self.min_speech_frames = max(1, round(min_speech_ms / FRAME_MS))
        self.end_silence_frames = max(1, round(end_silence_ms / FRAME_MS))
        self.max_turn_frames = max(1, round(max_turn_s * 1000 / FRAME_MS))
        self.preroll_frames = round(preroll_ms / FRAME_MS)
        self.in_turn = False
        self.speech_run = 0  # consecutive-ish speech frames (short gaps tolerated)
        self._gap = 0
        self._silence = 0
        self._frames: list[np.ndarray] = []  # the turn so far (or the pre-roll while idle)
        self._speech: list[bool] = []  # whether each of those frames was speech
        self.last_frame_speech = False
        self.speech_frames = 0  # speech frames in the current turn: tells whether speech followed a decode

    @property
    def speech_run_ms(self) -> float:
        return self.speech_run * FRAME_MS

    @property
    def silence_ms(self) -> float:
        """Silence since the last speech frame of the turn (0 outside a turn)."""
        return self._silence * FRAME_MS if self.in_turn else 0.0

    def turn_audio(self, max_pause_ms: float | None = None, *, whole_trailing: bool = False) -> np.ndarray:
        """The turn so far; with ``max_pause_ms``, every pause inside it shortened to that (Whisper drops or
        invents words around long silences; Smart Turn doubts a question with a pause of its own). A shortened
        pause keeps its first third (a word's soft ending) and its last two thirds: Silero scores a word's start
        late after a long silence, and a pause shortened from its end lost the start of "tomorrow" after 3 s
        (Smart Turn 0.43 for the question, against 0.93 with the pause's end kept). ``whole_trailing``: the
        silence after the last speech frame is kept whole (the turn model judges the pause it is asked about);
        else it keeps only its first ``max_pause_ms``."""
        if max_pause_ms is None:
            return np.concatenate(self._frames) if self._frames else np.zeros(0, np.float32)
        # The pre-roll before the first speech frame stays whole: it may hold a word the VAD scored late.
        first = next((i for i, speech in enumerate(self._speech) if speech), len(self._frames))
        keep = max(1, round(max_pause_ms / FRAME_MS))
        head = keep // 3
        frames, pause = list(self._frames[:first]), []
        for frame, speech in zip(self._frames[first:], self._speech[first:], strict=True):
            if not speech:
                pause.append(frame)
                continue
            frames += pause if len(pause) <= keep else pause[:head] + pause[len(pause) - (keep - head):]
            pause = []
            frames.append(frame)
        frames += pause if whole_trailing else pause[:keep]
        return np.concatenate(frames) if frames else np.zeros(0, np.float32)

    def push(self, frame: np.ndarray, probability: float, *, gated: bool = False) -> TurnStarted | TurnEnded | None:
        """One 512-sample frame. ``gated``: our own reply is playing, so this cannot be the user."""
        speech = probability >= self.threshold and not gated
        self.last_frame_speech = speech
        if speech:
            self.speech_run += 1
            self._gap = 0
        else:
            self._gap += 1
            if self._gap > 3:  # ~100 ms of non-speech ends a run; shorter dips are part of speaking
                self.speech_run = 0
        self._frames.append(frame)
        self._speech.append(speech)
        if not self.in_turn:
            self._frames = self._frames[-(self.preroll_frames + self.min_speech_frames):]
            self._speech = self._speech[-(self.preroll_frames + self.min_speech_frames):]
            if self.speech_run >= self.min_speech_frames:
                self.in_turn, self._silence, self.speech_frames = True, 0, self.speech_run
                return TurnStarted()
            return None
        self._silence = 0 if speech else self._silence + 1
        self.speech_frames += speech
        if self._silence >= self.end_silence_frames:
            return self._end(truncated=False)
        if len(self._frames) >= self.max_turn_frames:
            return self._end(truncated=True)
        return None

    def end_now(self) -> TurnEnded:
        """End the turn in progress here (the turn model found it complete)."""
        assert self.in_turn
        return self._end(truncated=False)

    def _end(self, truncated: bool) -> TurnEnded:
        audio = self.turn_audio(MAX_PAUSE_MS)
        if not truncated:  # drop the trailing silence that ended the turn (keep ~100 ms of it)
            trailing = min(self._silence, round(MAX_PAUSE_MS / FRAME_MS))  # as shortened by turn_audio
            audio = audio[: max(0, audio.size - max(0, trailing - 3) * FRAME_SAMPLES)]
        speech_frames, silence_ms = self.speech_frames, self._silence * FRAME_MS
        self.in_turn, self._frames, self._speech, self._silence, self.speech_run = False, [], [], 0, 0
        return TurnEnded(audio, truncated, speech_frames, 0.0 if truncated else silence_ms)


# Words an English sentence does not end on, and "tell me"-type requests still waiting for what to tell: Smart
# Turn hears "Could you tell me" spoken on its own as finished (~0.97 on Piper's voice, above "What colour is the
# sky?" at ~0.6), so its score alone cannot keep such a turn open. Prepositions are left out on purpose: "What are
# you looking at?" ends on one.
_UNFINISHED_LAST_WORDS = frozenset({"a", "an", "the", "and", "or", "but", "because", "my", "your", "our", "their"})
_AWAITING_CLAUSE = re.compile(
    r"\b(?:tell|show|give|ask|remind|teach)\s+(?:me|us)(?:\s+(?:what|where|when|who|whom|which|how|why|if|whether"
    r"|about))?$")


def sounds_unfinished(text: str) -> bool:
    """The transcript so far cannot be a whole English turn: it ends on an article, a conjunction or a possessive,
    or it asks to be told something without saying what ("Could you tell me?", "Can you tell me what?")."""
    words = re.sub(r"[^a-z' ]", " ", text.lower()).split()
    if not words:
        return False
    return words[-1] in _UNFINISHED_LAST_WORDS or _AWAITING_CLAUSE.search(" ".join(words)) is not None


ECHO_TAIL_S = 0.4  # room reverberation after our reply stops still reaches the microphone


class TurnTaking:
    """The voice loop's endpointing: an :class:`Endpointer` fed with echo gating (``voice.echo_gating``: no user
    speech while our reply plays, nor for ``ECHO_TAIL_S`` after), the edges of the user's speech (``went_quiet``,
    ``resumed``) and, with ``smart-turn``, the turn model's verdict on a pause (:meth:`finished`)."""

    def __init__(self, config: VoiceLoopConfig, model: TurnDetector | None, executor: Executor, *,
                 reply_playing: Callable[[], bool]) -> None:
        self.smart = config.turn_detection == "smart-turn" and model is not None
        end_silence = config.turn_max_silence_ms if self.smart else config.end_of_turn_silence_ms
        self.endpointer = Endpointer(threshold=config.vad_threshold, min_speech_ms=config.min_speech_ms,
                                     end_silence_ms=end_silence, max_turn_s=config.max_turn_s)
        self._model, self._executor = model, executor
        self._echo_gating = config.echo_gating
        self._check_silence_ms = config.turn_check_silence_ms
        self._threshold = config.turn_threshold
        self._reply_playing = reply_playing
        self._last_played = 0.0
        self._was_speech = False
        self._checked_frames = -1  # speech frames of the turn when the turn model was last asked
        self.went_quiet = False  # this frame is the first quiet one after speech
        self.resumed = False  # this frame is the first speech after a quiet one

    @property
    def speaking(self) -> bool:
        return self.endpointer.last_frame_speech

    @property
    def speech_frames(self) -> int:
        return self.endpointer.speech_frames

    def push(self, frame: np.ndarray, probability: float) -> TurnStarted | TurnEnded | None:
        event = self.endpointer.push(frame, probability, gated=self._gated())
        speech = self.endpointer.last_frame_speech
        self.went_quiet, self.resumed = self._was_speech and not speech, speech and not self._was_speech
        self._was_speech = speech
        if isinstance(event, TurnStarted):
            self._checked_frames = -1
        return event

    def how(self, ended: TurnEnded) -> EndOfTurn:
        """What ended a turn the endpointer ended (``TurnMetrics.end_of_turn``)."""
        return "max_turn" if ended.truncated else "silence_cap" if self.smart else "silence"

    def end_now(self) -> TurnEnded:
        return self.endpointer.end_now()

    def _gated(self) -> bool:
        if not self._echo_gating:
            return False
        if self._reply_playing():
            self._last_played = time.perf_counter()
            return True
        return time.perf_counter() - self._last_played < ECHO_TAIL_S

    def check_due(self) -> tuple[int, np.ndarray] | None:
        """With ``smart-turn``, once per stretch of speech after ``turn_check_silence_ms`` of silence: the speech
        frames and audio of the turn so far (its inner pauses shortened), for :meth:`finished`; else None."""
        endpointer = self.endpointer
        if not self.smart or endpointer.silence_ms < self._check_silence_ms \
                or self._checked_frames == endpointer.speech_frames:
            return None
        self._checked_frames = endpointer.speech_frames
        return endpointer.speech_frames, endpointer.turn_audio(TURN_MODEL_MAX_PAUSE_MS, whole_trailing=True)

    async def finished(self, audio: np.ndarray, metrics: TurnMetricsBuilder, *, still_quiet: Callable[[], bool],
                       words_unfinished: Callable[[], Awaitable[bool]]) -> bool:
        """Whether the turn model (on its own thread) finds the turn complete while the user is ``still_quiet``,
        and its words do not say otherwise (``words_unfinished``: "Could you tell me?"); records its score."""
        assert self._model is not None
        loop = asyncio.get_running_loop()
        started = time.perf_counter()
        try:
            score = await loop.run_in_executor(self._executor, self._model.completion, audio)
        except Exception:
            log.exception("turn model failed; the silence cap ends this turn")
            return False
        metrics.turn_score = round(score, 3)
        metrics.turn_model_ms = ms_since(started)
        return still_quiet() and score >= self._threshold and not await words_unfinished() and still_quiet()
