"""When does a spoken turn end? Smart Turn v3.2 (``voice.turn_detection: smart-turn``) asked at growing silence
after whole questions, and after the same questions cut between words (a user pausing mid-sentence). Offline:
Piper speaks the answer bench's questions (bench/answers.py) and the voice bench's (bench/voice.py); Silero VAD and
the voice loop's ``Endpointer`` measure the silence, as in a session; the words check is the voice loop's own
(``sounds_unfinished``), given the words before the cut.

Three tables, so that a change to turn taking is chosen by figures, not by ear:
- **one check at T ms**: whole questions the model ends (the rest wait for ``voice.turn_max_silence_ms``, the
  cap) beside fragments it ends (a pause that long there would cut the user off);
- **the default check, then a second at T ms**: what a re-check would add on each side;
- **a question resumed after a pause** (``--pause-ms``, after each cut the first check keeps open): the whole
  question ended at the default check, beside a later word ended (a second pause cut off), with the turn model
  given the inner pause as heard or shortened to each of ``--shorten`` ms (``TURN_MODEL_MAX_PAUSE_MS``).

    bash scripts/test.sh --exec .venv/bin/python -m bench.turn_ends
    ... -m bench.turn_ends --checks 200,400,600,800 --thresholds 0.5,0.7,0.9 --limit 20
    ... -m bench.turn_ends --checks 200 --thresholds 0.5 --pause-ms 600 --shorten 100,300
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from bench.answers import CONVERSATIONS
from bench.voice import PAUSED, QUESTIONS
from models.turn import SmartTurnV3
from models.vad import SileroVadModel
from pipelines.voice.config import VoiceLoopOptions
from pipelines.voice.endpointing import FRAME_SAMPLES, TURN_MODEL_MAX_PAUSE_MS, Endpointer, sounds_unfinished
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


def heard_frames(pcm: np.ndarray, silence_after_s: float, vad: SileroVadModel) -> Iterator[tuple[int, Endpointer]]:
    """``pcm`` after 0.3 s of silence and before ``silence_after_s``, frame by frame through Silero VAD and the voice
    loop's ``Endpointer`` (which never ends the turn here): (the frame's start in ``pcm``'s samples, the endpointer
    that has heard it)."""
    lead = int(0.3 * RATE)
    audio = np.concatenate([silence(0.3, RATE), pcm, silence(silence_after_s, RATE)]).astype(np.float32) / 32768
    stream, endpointer = vad.stream(), Endpointer(end_silence_ms=60_000)
    for start in range(0, audio.size - FRAME_SAMPLES + 1, FRAME_SAMPLES):
        frame = audio[start:start + FRAME_SAMPLES]
        endpointer.push(frame, stream.probability(frame))
        yield start - lead, endpointer


def scores_after(pcm: np.ndarray, checks: list[int], vad: SileroVadModel, model: SmartTurnV3) -> dict[int, float]:
    """The model's score of the turn so far when the endpointer has heard each of ``checks`` ms of silence (the
    audio the voice loop gives it: ``TurnTaking.check_due``)."""
    scores: dict[int, float] = {}
    for _, endpointer in heard_frames(pcm, max(checks) / 1000 + 0.1, vad):
        for check in checks:
            if endpointer.in_turn and check not in scores and endpointer.silence_ms >= check:
                scores[check] = float(model.completion(endpointer.turn_audio(TURN_MODEL_MAX_PAUSE_MS,
                                                                             whole_trailing=True)))
    return scores


@dataclass(frozen=True)
class Resumed:
    """A question spoken with a pause of its own, heard up to ``words``."""
    words: str
    whole: bool
    scores: dict[int | None, float]  # inner pauses shortened to (ms; None: as heard) -> score at the default check


def scores_at_end(pcm: np.ndarray, check: int, shortened: list[int | None], vad: SileroVadModel,
                  model: SmartTurnV3) -> dict[int | None, float]:
    """The model's score after ``check`` ms of silence at the end of ``pcm`` (which holds a pause of its own),
    given the turn as heard (None) and with the pauses inside it shortened to each of ``shortened`` ms, the
    silence being judged kept whole (``Endpointer.turn_audio``)."""
    for start, endpointer in heard_frames(pcm, check / 1000 + 0.1, vad):
        if start >= pcm.size and endpointer.in_turn and endpointer.silence_ms >= check:
            return {ms: float(model.completion(endpointer.turn_audio(ms, whole_trailing=True))) for ms in shortened}
    return {}


def resumed_after_pauses(text: str, pcm: np.ndarray, cuts: list[tuple[str, int]], kept_open: set[str],
                         pause_ms: int, check: int, shortened: list[int | None], vad: SileroVadModel,
                         model: SmartTurnV3) -> list[Resumed]:
    """``text`` paused for ``pause_ms`` after each cut the first check keeps open (``kept_open``), then heard on
    to each later cut (a fragment: ending there cuts the user off again) and to its end (whole)."""
    gap, heard = silence(pause_ms / 1000, RATE), []
    ends_at = [*cuts, (text, pcm.size)]
    for index, (before, cut) in enumerate(cuts):
        if before not in kept_open:
            continue
        for words, until in ends_at[index + 1:]:
            joined = np.concatenate([pcm[:cut], gap, pcm[cut:until]])
            heard.append(Resumed(words, until == pcm.size, scores_at_end(joined, check, shortened, vad, model)))
    return heard


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


def report_resumed(heard: list[Resumed], pause_ms: int, shortened: list[int | None],
                   default: VoiceLoopOptions) -> None:
    first, threshold = default.turn_check_silence_ms, default.turn_threshold
    whole = [r for r in heard if r.whole and r.scores]
    cut = [r for r in heard if not r.whole and r.scores]

    def ended(item: Resumed, shortened: int | None) -> bool:
        return item.scores[shortened] >= threshold and not sounds_unfinished(item.words)

    def share(items: list[Resumed], shortened: int | None) -> str:
        n = sum(ended(r, shortened) for r in items)
        return f"{n:4d}/{len(items)} {100 * n / max(1, len(items)):3.0f} %"

    print(f"\n== a question paused {pause_ms} ms mid-sentence (where the first check kept the turn open), then "
          f"resumed: ended at the default check ({first} ms, threshold {threshold}) after its last word (else the "
          "cap) | after a later word (a cut-off), the turn model given its inner pause as heard or shortened")
    print(f"  {'inner pause':>12}  {'whole ended':>14}  {'fragments ended':>16}")
    for ms in shortened:
        label = "as heard" if ms is None else f"<= {ms} ms"
        print(f"  {label:>12}  {share(whole, ms):>14}  {share(cut, ms):>16}")
    capped = sorted({r.words for r in whole if not ended(r, None)})
    print(f"\nresumed questions left to the cap with the pause as heard: {len(capped)}, "
          f"e.g. {', '.join(repr(c) for c in capped[:5]) or 'none'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checks", default="200,400,600,800,1000", help="silences (ms) at which to ask the model")
    parser.add_argument("--thresholds", default="0.5,0.7,0.9", help="completion thresholds to compare")
    parser.add_argument("--limit", type=int, default=0, help="only the first N questions (0: all)")
    parser.add_argument("--pause-ms", type=int, default=1000,
                        help="a pause mid-sentence the user then goes on from (0: leave that table out)")
    parser.add_argument("--shorten", default="200,300,500",
                        help="inner pauses shortened to (ms) for the turn model, beside the turn as heard")
    args = parser.parse_args()
    default = VoiceLoopOptions()
    checks = sorted({int(c) for c in args.checks.split(",")} | {default.turn_check_silence_ms})
    thresholds = sorted({float(t) for t in args.thresholds.split(",")} | {default.turn_threshold})
    texts = questions()[: args.limit or None]
    vad, model = SileroVadModel(), SmartTurnV3()
    started, heard = time.perf_counter(), []
    shortened: list[int | None] = [None, *(int(ms) for ms in args.shorten.split(","))]
    first, resumed = default.turn_check_silence_ms, []
    for text in texts:
        pcm, cuts = word_cuts(text, RATE)
        heard.append(Spoken(text, True, scores_after(pcm, checks, vad, model)))
        fragments = [Spoken(words, False, scores_after(pcm[:cut], checks, vad, model)) for words, cut in cuts[1:]]
        heard += fragments
        if args.pause_ms:
            kept_open = {f.words for f in fragments if f.scores and not ends(f, first, default.turn_threshold)}
            resumed += resumed_after_pauses(text, pcm, cuts[1:], kept_open, args.pause_ms, first, shortened, vad,
                                            model)
    report(heard, checks, thresholds, default)
    if args.pause_ms:
        report_resumed(resumed, args.pause_ms, shortened, default)
    print(f"\n{len(texts)} questions in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
