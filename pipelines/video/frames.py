"""Converting decoded video frames, safely from any thread.

PyAV caches one swscale context per ``VideoFrame`` (``frame.reformat`` and ``frame.to_ndarray(format=...)`` both
go through it) and swscale runs without the GIL: two threads converting the same frame at once share that context
and crash the process (a segfault, or a hang). One decoded frame can be converted by several threads here: the
batcher's BGR copy, an event snapshot, a clip encoded from buffered frames, a face or plate crop. So every thread
converts with a reformatter of its own (kept per thread, so its swscale context is reused frame after frame).
"""

from __future__ import annotations

import threading

import av
import numpy as np
from av.video.reformatter import VideoReformatter

_local = threading.local()


def _reformatter() -> VideoReformatter:
    reformatter = getattr(_local, "reformatter", None)
    if reformatter is None:
        reformatter = _local.reformatter = VideoReformatter()
    return reformatter


def reformat(frame: av.VideoFrame, *, width: int | None = None, height: int | None = None,
             format: str | None = None) -> av.VideoFrame:
    """``frame.reformat`` with this thread's reformatter: a new frame, owned by the caller."""
    return _reformatter().reformat(frame, width=width, height=height, format=format)


def to_array(frame: av.VideoFrame, format: str) -> np.ndarray:
    """``frame.to_ndarray(format=format)`` with this thread's reformatter."""
    if frame.format.name == format:
        return frame.to_ndarray()  # no conversion: the planes are only read
    return reformat(frame, format=format).to_ndarray()
