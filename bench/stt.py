"""Which speech-to-text hears best within the voice loop's budget? Each Whisper candidate decodes the spoken answer
bench's own questions (bench/answers.py) plus short questions with rarer words, as the live loop decodes a turn
(``transcribe_live``: the short window), under several voices and conditions:

* ``piper``: the packaged Piper voice (what bench/answers.py and bench/voice.py play); ``piper-fast`` and
  ``piper-slow`` the same voice at length scale 0.8 and 1.3; ``piper-varied`` with Piper's generator noise on;
* ``piper+noise``: white noise at 10 dB SNR; ``piper+babble``: another sentence under it at 10 dB SNR;
* ``espeak:VOICE``: espeak-ng, another synthesiser, in several English accents (American, Scottish, Caribbean,
  West Midlands) - the nearest to other speakers that ships offline.

Reported: word error rate per condition and model (words normalised: case, punctuation, numbers as digits), the
questions heard wrong at all, and decode time per utterance (median and p95, models in turn on the same audio so
that the machine's drift hits all alike; ratio to the first model).

    bash scripts/test.sh --exec .venv/bin/python -m bench.stt                      # tiny.en and base
    ... -m bench.stt --model tiny.en --model /path/to/ct2-whisper-dir --conditions piper,piper+noise
"""

from __future__ import annotations

import argparse
import re
import statistics
import time
from collections.abc import Callable
from functools import cache

import numpy as np

from bench.answers import CONVERSATIONS
from models.stt.whisper import WhisperStt
from models.tts.espeak import EspeakTts
from models.tts.piper import PiperTts
from pipelines.voice.audio import resample_pcm

RATE = 16_000
# Short questions with rarer words, the kind tiny.en mishears ("What animal says moo?" was heard "... move?").
RARER = [
    "What animal says moo?", "What sound does an owl make?", "How many hooves does a horse have?",
    "What is the freezing point of water?", "Which is heavier, a kilogram of feathers or of lead?",
    "What is a baby kangaroo called?", "Spell the word gnome.", "What do bees make?",
    "Is a tomato a fruit or a vegetable?", "What colour is chlorophyll?", "How many strings does a violin have?",
    "Who painted the Mona Lisa?",
]
UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()
# Whisper writes American spellings; the questions are British. Neither is a word heard wrong.
SPELLINGS = {"colour": "color", "colours": "colors", "favourite": "favorite", "theatre": "theater"}
ESPEAK_VOICES = ["en-us", "en-gb-scotland", "en-029", "en-gb-x-gbcwmd"]


def sentences() -> list[str]:
    seen = dict.fromkeys(q.text for c in CONVERSATIONS for q in c.questions)
    return [*seen, *RARER]


def number_words(n: int) -> str:
    """0..9999 in words ("one hundred forty"), as the questions say them; Whisper writes digits."""
    if n < 20:
        return UNITS[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + UNITS[n % 10])
    if n < 1000:
        return f"{UNITS[n // 100]} hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    return f"{number_words(n // 1000)} thousand" + ("" if n % 1000 == 0 else " " + number_words(n % 1000))


def normalise(text: str) -> list[str]:
    """Lower case, no punctuation, numbers in words, American spellings; "and" inside numbers dropped."""
    text = re.sub(r"\d{1,4}", lambda m: f" {number_words(int(m.group()))} ", text.lower().replace("-", " "))
    words = re.sub(r"[^a-z' ]+", " ", text).split()
    return [SPELLINGS.get(w, w) for w in words]


def word_errors(reference: list[str], heard: list[str]) -> int:
    """Word-level edit distance (substitutions + deletions + insertions)."""
    row = list(range(len(heard) + 1))
    for i, ref in enumerate(reference, 1):
        previous, row[0] = row[0], i
        for j, word in enumerate(heard, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (ref != word))
    return row[-1]


@cache
def piper(length_scale: float | None = None, deterministic: bool = True) -> PiperTts:
    return PiperTts(length_scale=length_scale, deterministic=deterministic)


def as_16k(samples: np.ndarray, rate: int) -> np.ndarray:
    return resample_pcm(samples, rate, RATE).astype(np.float32) / 32768.0


def spoken_by(tts: PiperTts | EspeakTts) -> Callable[[str], np.ndarray]:
    return lambda text: as_16k(tts.synthesize(text), tts.sample_rate)


def under(signal: np.ndarray, noise: np.ndarray, snr_db: float) -> np.ndarray:
    noise = np.resize(noise, signal.size)
    gain = np.sqrt(np.mean(signal**2) / max(np.mean(noise**2), 1e-12) / 10 ** (snr_db / 10))
    return np.clip(signal + gain * noise, -1.0, 1.0).astype(np.float32)


def conditions(texts: list[str]) -> dict[str, Callable[[str], np.ndarray]]:
    clean = spoken_by(piper())
    rng = np.random.default_rng(7)
    babble_text = "The weather tomorrow will be cloudy with some rain in the afternoon and a light wind."
    babble = spoken_by(piper(1.1))(babble_text)
    made: dict[str, Callable[[str], np.ndarray]] = {
        "piper": clean,
        "piper-fast": spoken_by(piper(0.8)),
        "piper-slow": spoken_by(piper(1.3)),
        "piper-varied": spoken_by(piper(deterministic=False)),
        "piper+noise": lambda text: under(clean(text), rng.standard_normal(RATE * 10).astype(np.float32), 10),
        "piper+babble": lambda text: under(clean(text), babble, 10),
    }
    for voice in ESPEAK_VOICES:
        made[f"espeak:{voice}"] = spoken_by(EspeakTts(voice))
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", action="append", help="tiny.en, base or a CTranslate2 Whisper directory "
                        "(repeatable; default: tiny.en and base)")
    parser.add_argument("--conditions", help="comma-separated subset of the conditions")
    parser.add_argument("--limit", type=int, help="only the first N sentences (a quick look)")
    parser.add_argument("--show", action="store_true", help="print every sentence heard wrong")
    args = parser.parse_args()
    texts = sentences()[:args.limit]
    made = conditions(texts)
    if args.conditions:
        made = {name: made[name] for name in args.conditions.split(",")}
    models = {name: WhisperStt(name) for name in args.model or ["tiny.en", "base"]}
    for model in models.values():
        model.warm_up()
    print(f"{len(texts)} sentences x {len(made)} conditions; models in turn: {', '.join(models)}", flush=True)
    errors = {(m, c): 0 for m in models for c in made}
    wrong = {(m, c): 0 for m in models for c in made}
    words = dict.fromkeys(made, 0)
    seconds: dict[str, list[float]] = {m: [] for m in models}
    for condition, speak in made.items():
        for text in texts:
            audio, reference = speak(text), normalise(text)
            words[condition] += len(reference)
            for name, model in models.items():
                start = time.perf_counter()
                heard = model.transcribe_live(audio, "en").text
                seconds[name].append(time.perf_counter() - start)
                count = word_errors(reference, normalise(heard))
                errors[name, condition] += count
                wrong[name, condition] += count > 0
                if count and args.show:
                    print(f"  {name:8} {condition:20} {text!r} -> {heard!r}")
        print(f"{condition:22} " + "  ".join(
            f"{name}: WER {errors[name, condition] / words[condition]:6.1%} ({wrong[name, condition]:2} of "
            f"{len(texts)} wrong)" for name in models), flush=True)
    total = sum(words.values())
    print("all conditions        " + "  ".join(
        f"{name}: WER {sum(errors[name, c] for c in made) / total:6.1%} "
        f"({sum(wrong[name, c] for c in made)} of {len(texts) * len(made)} wrong)" for name in models))
    first = next(iter(models))
    for name, times in seconds.items():
        median, p95 = statistics.median(times), float(np.percentile(times, 95))
        print(f"decode {name:8}: median {median * 1000:5.0f} ms, p95 {p95 * 1000:5.0f} ms "
              f"({median / statistics.median(seconds[first]):.2f}x {first})")


if __name__ == "__main__":
    main()
