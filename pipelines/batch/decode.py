"""Any audio (or video) file PyAV can read -> float32 mono 16 kHz samples in [-1, 1], as Whisper wants them."""

from __future__ import annotations

from pathlib import Path

import av
import numpy as np

SAMPLE_RATE = 16_000


class AudioDecodeError(ValueError):
    """The file is not audio we can read (corrupt, truncated, no audio stream, empty, too long)."""


def decode_audio_file(path: str | Path, max_seconds: float | None = None) -> np.ndarray:
    """Decode the first audio stream of ``path``. BLOCKING (run it on a worker thread).

    Raises :class:`AudioDecodeError` with a message fit for the client when the file is unreadable, has no
    audio stream, holds no samples, or is longer than ``max_seconds`` (checked while decoding, so a huge
    file is refused without decoding all of it).
    """
    limit = None if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    try:
        container = av.open(str(path), mode="r")
    except (av.error.FFmpegError, UnicodeDecodeError) as exc:
        raise AudioDecodeError(f"not a readable audio file ({_reason(exc)})") from None
    with container:
        if not container.streams.audio:
            raise AudioDecodeError("the file has no audio stream")
        stream = container.streams.audio[0]
        resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
        chunks: list[np.ndarray] = []
        total = 0
        try:
            for frame in container.decode(stream):
                frame.pts = None  # the resampler keeps its own timeline; broken timestamps must not matter
                for out in resampler.resample(frame):
                    chunks.append(out.to_ndarray().reshape(-1))
                    total += chunks[-1].size
                if limit is not None and total > limit:
                    raise AudioDecodeError(f"the audio is longer than the limit of {max_seconds:g} s")
            for out in resampler.resample(None):
                chunks.append(out.to_ndarray().reshape(-1))
        except av.error.FFmpegError as exc:
            raise AudioDecodeError(f"the audio stream cannot be decoded ({_reason(exc)})") from None
    if not chunks or total == 0:
        raise AudioDecodeError("the file holds no audio samples")
    samples = np.concatenate(chunks).astype(np.float32, copy=False)
    return np.clip(samples, -1.0, 1.0)


def _reason(exc: Exception) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
