"""Batch transcription throughput (audio seconds per wall second): chunks decoded in batches vs one by one.

The same files (Piper-synthesised speech with pauses, made on the spot) and the same Whisper instance go
through three paths in one process, interleaved (A B C, C B A, ...) so that drift and other load hit all alike:

* ``sequential``: faster-whisper's plain ``WhisperModel.transcribe`` per file (30-s windows one after the
  other, no VAD) — what a transcription without the batch pipeline does;
* ``chunks 1-by-1``: Vigil's batch path (VAD-cut chunks) with ``batch_size`` 1;
* ``batched``: Vigil's batch path with ``batch_size`` N (``transcription.batch_size``, default 8).

Run it offline like the tests:
    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.transcribe'
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections.abc import Callable

import numpy as np

from models.stt.batch import BatchedWhisper
from pipelines.batch.engine import transcribe_audio
from tests.support.speech_files import spoken, words

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Please call Stella and ask her to bring these things with her from the store.",
    "How many people do you see in the room right now?",
    "The weather today is sunny with a light breeze from the west.",
    "We will meet at the train station at noon tomorrow.",
    "My favourite animal is the elephant because it never forgets.",
    "The library closes at six in the evening on weekdays.",
    "Turn left at the second traffic light and park behind the bakery.",
    "Seven students passed the difficult exam last week.",
    "Bring an umbrella because it might rain this afternoon.",
    "The museum has a famous painting of a ship in a storm.",
    "Coffee tastes better in the morning with a little milk.",
]


def make_files(count: int, seconds: float, seed: int = 0) -> tuple[list[np.ndarray], int]:
    """``count`` float32 16 kHz recordings of about ``seconds`` each (shuffled sentences, varied pauses), and
    how many words they speak in all."""
    rng = random.Random(seed)
    files = []
    spoken_words = 0
    for _ in range(count):
        parts: list[np.ndarray] = []
        total = 0.0
        while total < seconds:
            sentence = rng.choice(SENTENCES)
            parts.append(spoken([sentence], pause_s=rng.choice([0.3, 0.6, 1.0, 1.5])))
            spoken_words += len(words(sentence))
            total += parts[-1].size / 16_000
        files.append(np.concatenate(parts).astype(np.float32) / 32768.0)
    return files, spoken_words


def run_sequential(model: BatchedWhisper, audio: np.ndarray) -> str:
    segments, _ = model._model.transcribe(audio, language="en", beam_size=1, temperature=0.0, vad_filter=False,
                                          condition_on_previous_text=False)
    return " ".join(s.text.strip() for s in segments)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=30.0, help="audio per file")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2, help="each path runs this many times over all files")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="CTranslate2 threads")
    args = parser.parse_args()

    files, spoken_words = make_files(args.files, args.seconds)
    audio_s = sum(f.size for f in files) / 16_000
    model = BatchedWhisper(cpu_threads=args.threads)
    paths: dict[str, Callable[[np.ndarray], str]] = {
        "sequential": lambda audio: run_sequential(model, audio),
        "chunks 1-by-1": lambda audio: transcribe_audio(model, audio, batch_size=1).text,
        f"batched (batch_size={args.batch_size})": lambda audio: transcribe_audio(
            model, audio, batch_size=args.batch_size).text,
    }
    for run in paths.values():  # warm-up (first-call costs), not measured
        run(files[0][: 16_000 * 5])
    wall = dict.fromkeys(paths, 0.0)
    texts: dict[str, list[str]] = {}
    for round_index in range(args.rounds):
        order = list(paths) if round_index % 2 == 0 else list(reversed(paths))
        for name in order:
            started = time.perf_counter()
            texts[name] = [paths[name](audio) for audio in files]
            wall[name] += time.perf_counter() - started

    print(f"Batch transcription: {args.files} files, {audio_s:.1f} s of audio, Whisper {model.name} "
          f"{model.compute_type} on {model.device}, {args.threads} threads, {args.rounds} rounds interleaved")
    print(f"{'path':<26}{'wall s':>10}{'audio s / wall s':>19}{'words':>8}{'vs sequential':>15}")
    base = wall["sequential"]
    for name in paths:
        per_round = wall[name] / args.rounds
        word_count = sum(len(words(t)) for t in texts[name])
        print(f"{name:<26}{per_round:>10.2f}{audio_s / per_round:>19.1f}{word_count:>8}{base / wall[name]:>14.2f}x")
    batched = next(name for name in paths if name.startswith("batched"))
    print(f"batched vs chunks 1-by-1: {wall['chunks 1-by-1'] / wall[batched]:.2f}x the throughput")
    print(f"words spoken: {spoken_words} (a path that hears fewer lost some; Whisper writes '6' for 'six')")


if __name__ == "__main__":
    main()
