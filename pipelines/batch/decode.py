"""Any audio (or video) file PyAV can read -> float32 mono 16 kHz samples in [-1, 1], as Whisper wants them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import av
import numpy as np

SAMPLE_RATE = 16_000


class AudioDecodeError(ValueError):
    """The file is not audio we can read (corrupt, truncated, no audio stream, empty, too long)."""


class AudioTooLong(AudioDecodeError):
    """The audio is longer than the limit given (for a direct request: submit it as a job instead)."""


def decode_audio_file(
    path: str | Path | BinaryIO, max_seconds: float | None = None, container_format: str | None = None
) -> np.ndarray:
    """Decode the first audio stream of ``path`` (or of an open binary file, read from its start). BLOCKING (run
    it on a worker thread). ``container_format``: the FFmpeg demuxer to use (None: FFmpeg probes the bytes).

    Raises :class:`AudioDecodeError` with a message fit for the client when the file is unreadable, has no
    audio stream, holds no samples, or is longer than ``max_seconds`` (:class:`AudioTooLong`, checked while
    decoding, so a huge file is refused without decoding all of it).
    """
    chunks = list(_decoded_chunks(path, max_seconds, container_format))
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    del chunks  # an hour of audio is 230 MB of float32: hold it twice at most, never three times
    return np.clip(samples, -1.0, 1.0, out=samples)


def audio_duration(path: str | Path | BinaryIO, max_seconds: float | None = None) -> float:
    """Seconds of audio in ``path``, found by decoding it all (container durations can lie) without keeping the
    samples: a multi-hour upload is checked in constant memory. BLOCKING; raises as :func:`decode_audio_file`."""
    return sum(chunk.size for chunk in _decoded_chunks(path, max_seconds)) / SAMPLE_RATE


def _decoded_chunks(
    path: str | Path | BinaryIO, max_seconds: float | None, container_format: str | None = None
) -> Iterator[np.ndarray]:
    """The samples of the first audio stream, piece by piece; at least one non-empty piece or an error."""
    limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    if not isinstance(path, (str, Path)):
        path.seek(0)
    try:
        container = av.open(str(path) if isinstance(path, (str, Path)) else path, mode="r", format=container_format)
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise AudioDecodeError(f"not a readable audio file ({_reason(exc)})") from None
    total = 0
    with container:
        if not container.streams.audio:
            raise AudioDecodeError("the file has no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        try:
            for frame in container.decode(stream):
                frame.pts = None  # the resampler keeps its own timeline; broken timestamps must not matter
                for out in resampler.resample(frame):
                    samples = out.to_ndarray().reshape(-1)
                    total += samples.size
                    yield samples
                if limit is not None and total > limit:
                    raise AudioTooLong(f"the audio is longer than the limit of {max_seconds:g} s")
            for out in resampler.resample(None):
                samples = out.to_ndarray().reshape(-1)
                total += samples.size
                yield samples
        except av.error.FFmpegError as exc:
            raise AudioDecodeError(f"the audio stream cannot be decoded ({_reason(exc)})") from None
    if total == 0:
        raise AudioDecodeError("the file holds no audio samples")


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
