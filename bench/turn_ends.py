"""When does a spoken turn end? Smart Turn v3.2 (``voice.turn_detection: smart-turn``) asked at growing silence
after whole questions, and after the same questions cut between words (a user pausing mid-sentence). Offline:
Piper speaks the answer bench's questions (bench/answers.py) and the voice bench's (bench/voice.py); Silero VAD and
the voice loop's ``Endpointer`` measure the silence, as in a session; the words check is the voice loop's own
(``sounds_unfinished``), given the words before the cut.

Two tables, so that a change to turn taking is chosen by figures, not by ear:
- **one check at T ms**: whole questions the model ends (the rest wait for ``voice.turn_max_silence_ms``, the
  cap) beside fragments it ends (a pause that long there would cut the user off);
- **the default check, then a second at T ms**: what a re-check would add on each side.

    bash scripts/test.sh --exec .venv/bin/python -m bench.turn_ends
    ... -m bench.turn_ends --checks 200,400,600,800 --thresholds 0.5,0.7,0.9 --limit 20
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

import numpy as np

from bench.answers import CONVERSATIONS
from bench.voice import PAUSED, QUESTIONS
from models.turn import SmartTurnV3
from models.vad import SileroVadModel
from pipelines.voice.config import VoiceLoopOptions
from pipelines.voice.endpointing import FRAME_SAMPLES, Endpointer, sounds_unfinished
from tests.support.audio import silence, word_cuts

RATE = 16_000


@dataclass(frozen=True)
class Spoken:
    words: str
    whole: bool
    scores: dict[int, float]  # silence (ms) -> the turn model's completion probability


def questions() -> list[str]:
    asked = [q.text for conversation in CONVERSATIONS for q in conversation.questions]
    return list(dict.fromkeys([*asked, *QUESTIONS, " ".join(PAUSED)]))


def scores_after(pcm: np.ndarray, checks: list[int], vad: SileroVadModel, model: SmartTurnV3) -> dict[int, float]:
    """The model's score of the turn so far when the endpointer has heard each of ``checks`` ms of silence."""
    tail = max(checks) / 1000 + 0.1
    audio = np.concatenate([silence(0.3, RATE), pcm, silence(tail, RATE)]).astype(np.float32) / 32768
    stream, endpointer, scores = vad.stream(), Endpointer(end_silence_ms=10 * max(checks)), {}
    for start in range(0, audio.size - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = audio[start:start + FRAME_SAMPLES]
        endpointer.push(frame, stream.probability(frame))
        for check in checks:
            if endpointer.in_turn and check not in scores and endpointer.silence_ms >= check:
                scores[check] = float(model.completion(endpointer.turn_audio()))
    return scores


def ends(spoken: Spoken, check: int, threshold: float) -> bool:
    """Whether the voice loop would end the turn at ``check`` ms of silence: the model, then the words."""
    return spoken.scores.get(check, 0.0) >= threshold and not sounds_unfinished(spoken.words)


def report(heard: list[Spoken], checks: list[int], thresholds: list[float], default: VoiceLoopOptions) -> None:
    whole = [s for s in heard if s.whole]
    cut = [s for s in heard if not s.whole and s.scores]
    first, threshold = default.turn_check_silence_ms, default.turn_threshold

    def share(items: list[Spoken], check: int, limit: float) -> str:
        n = sum(ends(s, check, limit) for s in items)
        return f"{n:3d}/{len(items)} {100 * n / max(1, len(items)):3.0f} %"

    print(f"\n{len(whole)} whole questions, {len(cut)} cut between words; a turn ends when the model's score >= the "
          "threshold and its words do not sound unfinished")
    print("\n== one check at T ms of silence: whole questions ended (else the cap) | fragments ended (a cut-off)")
    print(f"  {'T ms':>6}  {'threshold':>9}  {'whole ended':>14}  {'fragments ended':>16}")
    for check in checks:
        for limit in thresholds:
            print(f"  {check:6d}  {limit:9.2f}  {share(whole, check, limit):>14}  {share(cut, check, limit):>16}")
    print(f"\n== the default check ({first} ms, threshold {threshold}), then a second at T ms: what the second adds")
    print(f"  {'T ms':>6}  {'threshold':>9}  {'whole: +ended':>14}  {'still capped':>12}  {'fragments: +cut':>16}")
    kept_whole = [s for s in whole if not ends(s, first, threshold)]
    kept_cut = [s for s in cut if not ends(s, first, threshold)]
    print(f"  {'-':>6}  {'-':>9}  {'(default)':>14}  {len(kept_whole):12d}  {'(default)':>16}")
    for check in (c for c in checks if c > first):
        for limit in thresholds:
            more_whole = sum(ends(s, check, limit) for s in kept_whole)
            more_cut = sum(ends(s, check, limit) for s in kept_cut)
            print(f"  {check:6d}  {limit:9.2f}  {f'+{more_whole}':>14}  {len(kept_whole) - more_whole:12d}  "
                  f"{f'+{more_cut} of {len(kept_cut)}':>16}")
    capped = ", ".join(repr(s.words) for s in kept_whole)
    print(f"\nwhole questions the default check leaves to the cap: {capped or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", default="200,400,600,800,1000", help="silences (ms) at which to ask the model")
    parser.add_argument("--thresholds", default="0.5,0.7,0.9", help="completion thresholds to compare")
    parser.add_argument("--limit", type=int, default=0, help="only the first N questions (0: all)")
    args = parser.parse_args()
    default = VoiceLoopOptions()
    checks = sorted({int(c) for c in args.checks.split(",")} | {default.turn_check_silence_ms})
    thresholds = sorted({float(t) for t in args.thresholds.split(",")} | {default.turn_threshold})
    texts = questions()[: args.limit or None]
    vad, model = SileroVadModel(), SmartTurnV3()
    started, heard = time.perf_counter(), []
    for text in texts:
        pcm, cuts = word_cuts(text, RATE)
        heard.append(Spoken(text, True, scores_after(pcm, checks, vad, model)))
        heard += [Spoken(words, False, scores_after(pcm[:cut], checks, vad, model)) for words, cut in cuts[1:]]
    report(heard, checks, thresholds, default)
    print(f"\n{len(texts)} questions in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
