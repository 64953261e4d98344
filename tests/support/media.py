"""Test media made on the spot with PyAV: no downloads."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import av
import numpy as np


def make_clip(path: Path, seconds: float = 2.0, fps: int = 15, size: tuple[int, int] = (320, 240),
              audio: bool = True, video: bool = True, sample_rate: int = 48000) -> Path:
    """An MP4 (H.264 + AAC) with a moving bright square and a 440 Hz tone."""
    width, height = size
    with av.open(str(path), "w") as container:
        vstream = container.add_stream("libx264", rate=fps) if video else None
        if vstream is not None:
            vstream.width, vstream.height, vstream.pix_fmt = width, height, "yuv420p"
            vstream.options = {"preset": "ultrafast", "tune": "zerolatency"}
        astream = container.add_stream("aac", rate=sample_rate) if audio else None
        if astream is not None:
            astream.layout = "mono"
        frames = int(seconds * fps)
        for index in range(frames if vstream is not None else 0):
            picture = np.full((height, width, 3), 40, np.uint8)
            x = int((width - 40) * index / max(frames - 1, 1))
            picture[height // 2 - 20: height // 2 + 20, x: x + 40] = 230
            frame = av.VideoFrame.from_ndarray(picture, format="rgb24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in vstream.encode(frame):
                container.mux(packet)
        if vstream is not None:
            for packet in vstream.encode():
                container.mux(packet)
        if astream is not None:
            chunk = 1024
            total = int(seconds * sample_rate)
            for start in range(0, total, chunk):
                t = (np.arange(start, min(start + chunk, total)) / sample_rate).astype(np.float32)
                samples = (0.3 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)[None, :]
                frame = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
                frame.sample_rate, frame.pts, frame.time_base = sample_rate, start, Fraction(1, sample_rate)
                for packet in astream.encode(frame):
                    container.mux(packet)
            for packet in astream.encode():
                container.mux(packet)
    return path
