"""Text readers for licence plates: the protocol (the text lines in a BGR image, each with its box and the
recogniser's confidence; blocking, so callers run it on a worker thread) and the registry of backends, one module
each (``rapidocr``). No general (non-Chinese) plate detector ships offline, so the reader looks at a whole vehicle
crop and the caller keeps the lines that look like a plate (``pipelines.video.plates``)."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from models.registry import Registry


@dataclass(frozen=True, slots=True)
class TextLine:
    text: str
    score: float  # the recogniser's mean character confidence, 0..1
    box: tuple[float, float, float, float]  # x1, y1, x2, y2 in pixels of the image read


class TextReader(Protocol):
    name: str

    def read(self, image: np.ndarray) -> list[TextLine]:
        """Every text line found in a BGR uint8 HxWx3 image."""
        ...


TEXT_READERS: Registry[TextReader] = Registry("plates", default="rapidocr")

TEXT_READERS.discover(sys.modules[__name__])  # each module registers itself on import
