"""A finished transcription in OpenAI's response formats: json, text, verbose_json, srt, vtt."""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any, Literal

from models.stt.batch import FileSegment

ResponseFormat = Literal["json", "text", "verbose_json", "srt", "vtt"]
RESPONSE_FORMATS: tuple[str, ...] = ("json", "text", "verbose_json", "srt", "vtt")
CONTENT_TYPES: dict[str, str] = {
    "json": "application/json", "verbose_json": "application/json", "text": "text/plain",
    "srt": "application/x-subrip", "vtt": "text/vtt",
}
FILE_EXTENSIONS: dict[str, str] = {"json": "json", "verbose_json": "json", "text": "txt", "srt": "srt", "vtt": "vtt"}


@dataclass(frozen=True, slots=True)
class Transcript:
    language: str
    duration: float  # seconds of audio
    segments: tuple[FileSegment, ...]

    @property
    def text(self) -> str:
        return " ".join(s.text for s in self.segments if s.text).strip()


LANGUAGE_NAMES = {"en": "english"}  # OpenAI's verbose_json names the language; others fall back to the code


def as_json(transcript: Transcript, response_format: str, *, words: bool = False) -> dict[str, Any] | None:
    """The JSON body for json / verbose_json (with every word's times if ``words``); None for the text formats."""
    if response_format == "json":
        return {"text": transcript.text}
    if response_format == "verbose_json":
        body: dict[str, Any] = {
            "task": "transcribe",
            "language": LANGUAGE_NAMES.get(transcript.language, transcript.language),
            "duration": round(transcript.duration, 3),
            "text": transcript.text,
            "segments": [
                {
                    "id": index, "seek": 0, "start": s.start, "end": s.end, "text": s.text,
                    "tokens": list(s.tokens), "temperature": s.temperature, "avg_logprob": s.avg_logprob,
                    "compression_ratio": s.compression_ratio, "no_speech_prob": s.no_speech_prob,
                }
                for index, s in enumerate(transcript.segments)
            ],
        }
        if words:
            body["words"] = [{"word": w.word.strip(), "start": w.start, "end": w.end}
                             for s in transcript.segments for w in s.words]
        return body
    return None


def as_text(transcript: Transcript, response_format: str) -> str:
    """The body for text / srt / vtt."""
    if response_format == "text":
        return transcript.text + "\n"
    cues = _cues(transcript.segments)
    if response_format == "srt":
        return "".join(
            f"{n}\n{_timestamp(start, ',')} --> {_timestamp(end, ',')}\n{_cue_text(text)}\n\n"
            for n, (start, end, text) in enumerate(cues, start=1)
        )
    if response_format == "vtt":
        # WebVTT cue text is HTML-like: '&' and '<' start entities and tags, so they are escaped (and '>' too)
        return "WEBVTT\n\n" + "".join(
            f"{_timestamp(start, '.')} --> {_timestamp(end, '.')}\n{_vtt_text(text)}\n\n"
            for start, end, text in cues
        )
    raise ValueError(f"{response_format!r} is not a text format")


def _cues(segments: tuple[FileSegment, ...]) -> list[tuple[int, int, str]]:
    """(start ms, end ms, text) of the segments with text: in order, each at least 1 ms long (both specs want
    the end after the start; a one-word cue may be aligned to zero length) and none before the previous end."""
    cues: list[tuple[int, int, str]] = []
    previous_end = 0
    for segment in segments:
        if not segment.text.strip():
            continue
        start = max(round(segment.start * 1000), previous_end)
        end = max(round(segment.end * 1000), start + 1)
        cues.append((start, end, segment.text))
        previous_end = end
    return cues


def _cue_text(text: str) -> str:
    """One line of cue text: a blank line would end the cue and '-->' would read as a timing line (both specs)."""
    return " ".join(text.split()).replace("-->", "->")


def _vtt_text(text: str) -> str:
    return html.escape(_cue_text(text), quote=False)


def _timestamp(millis: int, decimal_marker: str) -> str:
    hours, millis = divmod(millis, 3_600_000)
    minutes, millis = divmod(millis, 60_000)
    secs, millis = divmod(millis, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{decimal_marker}{millis:03d}"
