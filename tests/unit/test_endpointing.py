"""The endpointer's turn audio keeps the speech the VAD was late on and shortens pauses inside a turn (pure
logic: VAD probabilities given)."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.voice.endpointing import FRAME_SAMPLES, Endpointer, TurnEnded, TurnStarted, sounds_unfinished


def _frame(value: float) -> np.ndarray:
    return np.full(FRAME_SAMPLES, value, np.float32)


def test_a_turn_keeps_the_first_word_the_vad_was_half_a_second_late_on():
    endpointer = Endpointer(min_speech_ms=250, end_silence_ms=600)
    events = [endpointer.push(_frame(0.0), 0.0) for _ in range(30)]  # 1 s of silence before
    # 0.55 s of the first word that the VAD scores low, then clear speech (each frame marks itself: 1.0 / 2.0)
    events += [endpointer.push(_frame(1.0), 0.2) for _ in range(17)]
    events += [endpointer.push(_frame(2.0), 0.9) for _ in range(30)]
    events += [endpointer.push(_frame(0.0), 0.0) for _ in range(30)]
    assert sum(isinstance(event, TurnStarted) for event in events) == 1
    (ended,) = [event for event in events if isinstance(event, TurnEnded)]
    assert np.count_nonzero(ended.audio == 1.0) == 17 * FRAME_SAMPLES  # the late-scored word is all there
    assert np.count_nonzero(ended.audio == 2.0) == 30 * FRAME_SAMPLES


def test_a_pause_inside_the_turn_is_shortened_and_the_silence_after_it_kept_whole_when_asked():
    endpointer = Endpointer(min_speech_ms=250, end_silence_ms=5000)
    pause = [0.5 + k / 128 for k in range(40)]  # a 1.3 s pause, each frame its own value (exact in float32)
    frames = [(0.0, 0.0)] * 10 + [(1.0, 0.9)] * 20 + [(v, 0.0) for v in pause] + [(2.0, 0.9)] * 20 + [(0.25, 0.0)] * 25
    for value, probability in frames:  # silence, words, the pause, words, 0.8 s of silence
        endpointer.push(_frame(value), probability)

    def values(audio: np.ndarray) -> list[float]:
        return [float(v) for v in audio[::FRAME_SAMPLES] if v != 0.0]

    assert values(endpointer.turn_audio()) == [v for v, _ in frames[10:]]
    # Every pause shortened to 10 frames: the inner one keeps its first 3 (a soft word ending) and last 7 (the
    # next word's start, which the VAD may score late); the last one keeps its start.
    kept_pause = [*pause[:3], *pause[-7:]]
    assert values(endpointer.turn_audio(320)) == [1.0] * 20 + kept_pause + [2.0] * 20 + [0.25] * 10
    # For the turn model, the silence it is asked about stays whole.
    assert values(endpointer.turn_audio(320, whole_trailing=True)) == [1.0] * 20 + kept_pause + [2.0] * 20 + [
        0.25] * 25


@pytest.mark.parametrize(("text", "unfinished"), [
    ("Could you tell me?", True),  # Whisper's punctuation does not make it a question that was asked
    ("Could you tell me what?", True),
    ("Can you show us how", True),
    ("Tell me about", True),
    ("I went to the shop and", True),
    ("Where did I leave my", True),
    ("What is the capital of France?", False),
    ("What are you looking at?", False),  # a preposition may end an English question
    ("Tell me a story.", False),
    ("Could you tell me what the weather will be like tomorrow?", False),
    ("", False),
])
def test_a_transcript_that_cannot_end_a_turn(text: str, unfinished: bool):
    assert sounds_unfinished(text) is unfinished
