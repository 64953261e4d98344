"""Speech to text for recorded files: long audio is cut at VAD pauses into chunks of at most ``max_chunk_s``
seconds, and the chunks are decoded several at a time with faster-whisper's ``BatchedInferencePipeline``.

This is the throughput path (uploads, batch jobs, ``vigil transcribe``); the live voice loop uses
:class:`models.stt.whisper.WhisperStt`. Each process loads its own :class:`BatchedWhisper`, separate from the live
model, so batch work never queues behind (or ahead of) live voice turns inside CTranslate2.

Chunks are planned first (:meth:`BatchedWhisper.plan`) and decoded afterwards
(:meth:`BatchedWhisper.transcribe_chunks`), so a caller can decode a few chunks at a time and persist each
step: a job interrupted half-way resumes at its first undecoded chunk. Every call is BLOCKING: run it on a
worker thread. Calls are thread-safe (CTranslate2 runs up to ``num_workers`` at once).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from models.stt.whisper import SAMPLE_RATE, LocalWhisper, as_mono_float

WHISPER_MAX_CHUNK_S = 30.0  # Whisper's window: a longer chunk would be cut off
DEFAULT_MAX_CUE_S = 6.0  # a subtitle cue longer than this is cut at the next word
CUE_PAUSE_S = 0.5  # a silence this long between two words ends a cue
SENTENCE_END = (".", "?", "!", "。", "？", "！")
CLAUSE_END = (",", ";", ":", "、", "，")


@dataclass(frozen=True, slots=True)
class AudioChunk:
    """A contiguous span of the audio (seconds), cut at pauses; silence inside it is kept."""

    start: float
    end: float

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True, slots=True)
class TimedWord:
    """One word as Whisper aligned it (cross-attention); ``word`` keeps its leading space."""

    start: float
    end: float
    word: str


@dataclass(frozen=True, slots=True)
class FileSegment:
    """One decoded segment (a subtitle cue: a few seconds, sentence-ish); times are seconds from the start of
    the file. ``words``: its words with their times (empty in results stored before words were kept)."""

    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    avg_logprob: float
    no_speech_prob: float
    compression_ratio: float
    temperature: float
    words: tuple[TimedWord, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["tokens"] = list(self.tokens)
        data["words"] = [[w.start, w.end, w.word] for w in self.words]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FileSegment:
        words = tuple(TimedWord(float(s), float(e), str(w)) for s, e, w in data.get("words", ()))
        return cls(**{**data, "tokens": tuple(data["tokens"]), "words": words})


class BatchedWhisper(LocalWhisper):
    """Whisper (CTranslate2) for files: VAD-cut chunks decoded in batches. Load once per process; share.

    ``model_dir``: as for :class:`models.stt.whisper.WhisperStt` (None: packaged tiny.en, ``"base"``, or a CT2
    directory). ``num_workers``: how many calls CTranslate2 runs at once (one per thread that calls in).
    """

    def check_language(self, language: str | None) -> None:
        """ValueError if this model cannot transcribe ``language`` (None: detect; multilingual models only)."""
        if language is None or language == "en":
            return
        if not self.multilingual:
            raise ValueError(f"Whisper {self.name!r} is English-only; language {language!r} is not available")
        if language not in self._model.supported_languages:
            raise ValueError(f"unknown language code {language!r} (use ISO-639-1, e.g. 'en', 'de', 'ko')")

    def plan(self, audio: np.ndarray, max_chunk_s: float = WHISPER_MAX_CHUNK_S) -> list[AudioChunk]:
        """Cut ``audio`` (float32 mono 16 kHz) at VAD pauses into chunks of at most ``max_chunk_s``. Blocking.

        Speech regions come from Silero VAD (faster-whisper's ``get_speech_timestamps``, which also splits a
        region longer than ``max_chunk_s`` at its quietest point); neighbouring regions are merged while the
        merged span stays within ``max_chunk_s``. Audio without speech gives no chunks.
        """
        from faster_whisper.vad import VadOptions, get_speech_timestamps

        max_chunk_s = min(max_chunk_s, WHISPER_MAX_CHUNK_S)
        samples = as_mono_float(audio)
        if samples.size == 0:
            return []
        regions = get_speech_timestamps(
            samples, VadOptions(max_speech_duration_s=max_chunk_s, min_silence_duration_ms=160)
        )
        limit = int(max_chunk_s * SAMPLE_RATE)
        chunks: list[tuple[int, int]] = []
        for region in regions:
            start, end = int(region["start"]), min(int(region["end"]), samples.size)
            if chunks and end - chunks[-1][0] <= limit:
                chunks[-1] = (chunks[-1][0], end)
            else:
                chunks.append((start, min(end, start + limit)))
        return [AudioChunk(math.floor(s / SAMPLE_RATE * 1000) / 1000, math.floor(e / SAMPLE_RATE * 1000) / 1000)
                for s, e in chunks]

    def transcribe_chunks(
        self,
        audio: np.ndarray,
        chunks: list[AudioChunk],
        language: str | None = "en",
        batch_size: int = 8,
        initial_prompt: str | None = None,
        temperature: float = 0.0,
        max_cue_s: float = DEFAULT_MAX_CUE_S,
    ) -> tuple[list[list[FileSegment]], str]:
        """Decode ``chunks`` of ``audio`` in batches of ``batch_size``: (segments per chunk, language). Blocking.

        Greedy decoding without timestamp tokens, with word timestamps (cross-attention alignment): each chunk's
        text is then cut into cues (:func:`group_into_cues`) at pauses, sentence ends and ``max_cue_s``, so the
        segments are readable subtitles while every decoded word lands in exactly one of them. Timestamp tokens
        would also give finer segments, but in a batch there is no second pass over what the model leaves out:
        Whisper often stops at its last timestamp before the end of a long chunk, and those words would be lost.
        """
        self.check_language(language)
        if not chunks:
            return [], language or "en"
        from faster_whisper import BatchedInferencePipeline

        samples = as_mono_float(audio)
        duration = samples.size / SAMPLE_RATE
        pipeline = BatchedInferencePipeline(self._model)  # cheap; holds per-call state, so one per call
        segments, info = pipeline.transcribe(
            samples,
            language=language if self.multilingual else "en",
            # within the audio: faster-whisper refuses clips that add up to more than the audio's duration
            clip_timestamps=[{"start": min(c.start, duration), "end": min(c.end, duration)} for c in chunks],
            batch_size=max(1, batch_size),
            beam_size=1,
            temperature=temperature,
            without_timestamps=True,
            word_timestamps=True,
            initial_prompt=initial_prompt,
        )
        per_chunk: list[list[FileSegment]] = [[] for _ in chunks]
        starts = [round(c.start * self._model.frames_per_second) for c in chunks]
        for segment in segments:  # decoding happens while iterating
            # `seek` is the frame offset of the chunk the segment came from
            index = _nearest(starts, segment.seek)
            chunk = chunks[index]
            whole = FileSegment(
                start=_clamp(float(segment.start), chunk), end=_clamp(float(segment.end), chunk),
                text=segment.text.strip(), tokens=tuple(int(t) for t in segment.tokens),
                avg_logprob=float(segment.avg_logprob), no_speech_prob=float(segment.no_speech_prob),
                compression_ratio=float(segment.compression_ratio), temperature=float(segment.temperature or 0.0),
            )
            words = _monotonic([TimedWord(_clamp(float(w.start), chunk), _clamp(float(w.end), chunk), w.word)
                                for w in segment.words or ()])
            if not words:  # nothing aligned (no speech): keep the segment as it is
                per_chunk[index].append(whole)
                continue
            for cue_words in group_into_cues(words, max_cue_s):
                text = "".join(w.word for w in cue_words).strip()
                per_chunk[index].append(dataclasses.replace(
                    whole, start=cue_words[0].start, end=cue_words[-1].end, text=text, words=tuple(cue_words),
                    # the cue's own tokens (Whisper's tokenizer), so verbose_json's tokens match its text
                    tokens=tuple(self._model.hf_tokenizer.encode(" " + text, add_special_tokens=False).ids),
                ))
        return per_chunk, info.language

    def warm_up(self) -> None:
        """One tiny decode so the first real request does not pay one-off costs. Blocking."""
        silence = np.zeros(SAMPLE_RATE, dtype=np.float32)
        self.transcribe_chunks(silence, [AudioChunk(0.0, 1.0)])


def group_into_cues(words: list[TimedWord], max_cue_s: float = DEFAULT_MAX_CUE_S) -> list[list[TimedWord]]:
    """Cut a run of words into subtitle cues, each word in exactly one cue, in order.

    A cue ends after a sentence end (``.?!``), before a pause of ``CUE_PAUSE_S`` or more, after a clause end
    (``,;:``) once it is half of ``max_cue_s`` long, and before a word that would take it past ``max_cue_s``
    (a single word longer than that still makes one cue).
    """
    cues: list[list[TimedWord]] = []
    current: list[TimedWord] = []
    for word in words:
        if current:
            previous = current[-1].word.rstrip()
            if (previous.endswith(SENTENCE_END)
                    or word.start - current[-1].end >= CUE_PAUSE_S
                    or word.end - current[0].start > max_cue_s
                    or (previous.endswith(CLAUSE_END) and current[-1].end - current[0].start >= max_cue_s / 2)):
                cues.append(current)
                current = []
        current.append(word)
    if current:
        cues.append(current)
    return cues


def _clamp(seconds: float, chunk: AudioChunk) -> float:
    return min(max(seconds, chunk.start), chunk.end)  # Whisper may overshoot the chunk


def _monotonic(words: list[TimedWord]) -> list[TimedWord]:
    """Words whose times never go back (alignment can jitter), so cues never overlap."""
    out: list[TimedWord] = []
    floor = 0.0
    for word in words:
        start = max(word.start, floor)
        end = max(word.end, start)
        out.append(TimedWord(start, end, word.word))
        floor = end
    return out


def _nearest(values: list[int], target: int) -> int:
    return min(range(len(values)), key=lambda i: abs(values[i] - target))
