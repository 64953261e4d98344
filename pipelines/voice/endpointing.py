"""Turn detection from per-frame VAD probabilities: start after enough speech, end after enough silence.

The silence that ends a turn on its own is ``end_silence_ms`` (with semantic turn detection, the cap for a turn
the model called unfinished); the voice loop may end a turn sooner with :meth:`Endpointer.end_now`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

FRAME_SAMPLES = 512  # Silero's frame at 16 kHz: 32 ms
FRAME_MS = FRAME_SAMPLES / 16.0
MAX_PAUSE_MS = 500  # pauses inside a turn are shortened to this before decoding it


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

    def turn_audio(self, max_pause_ms: float | None = None) -> np.ndarray:
        """The turn so far; with ``max_pause_ms``, every pause inside it shortened to that (Whisper drops or
        invents words around long silences)."""
        frames = self._frames
        if max_pause_ms is not None:
            # The pre-roll before the first speech frame stays whole: it may hold a word the VAD scored late.
            first = next((i for i, speech in enumerate(self._speech) if speech), len(self._frames))
            keep, run = max(1, round(max_pause_ms / FRAME_MS)), 0
            frames = self._frames[:first]
            for frame, speech in zip(self._frames[first:], self._speech[first:], strict=True):
                run = 0 if speech else run + 1
                if run <= keep:
                    frames.append(frame)
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
