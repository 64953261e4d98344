"""Which car: licence plates read from vehicle tracks (``video.plates``).

No general plate detector ships offline, so the text reader (PP-OCRv4) looks at the vehicle's crop, at most once per
``interval_s`` per track (less often while nothing is read) and ``max_per_frame`` vehicles per analysed frame, on
the plates thread (never the event loop; ``pipelines.video.looks``). Of the lines it reads, those that look like a
plate (4-10 letters and digits, at least one digit, once spaces and dashes are dropped) are candidates, and each
track keeps its best reading (highest confidence) as ``plate``, with the name of a known plate
(``video.plates.known``). A track whose best reading reached ``settle_score`` is not read again.

What cannot work is refused or named at start-up: ``check_known`` (a known plate the reader can never read,
two names for one plate) and ``label_problems`` (plate labels the app's detector does not have, or none at all).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import av
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from models.detectors import Detection
from models.plates import TextLine, TextReader
from pipelines.video.frames import to_array
from pipelines.video.looks import TrackLooks

_NOT_PLATE = re.compile(r"[^A-Z0-9]")
_PLATE = re.compile(r"^(?=.*\d)[A-Z0-9]{4,10}$")
PLATE_RULE = "4-10 letters and digits with at least one digit, once spaces, dashes and case are dropped"
MIN_CROP_PX = 32


class PlateReadingConfig(BaseModel):
    """Plate reading's knobs, declared once: ``video.plates`` in the server's config is this model (and the text
    reader's backend)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description=(
        "Read licence plates of vehicle tracks (needs a detector with vehicles: opencv-ssd, or a COCO YOLO): tracks "
        "and their events carry plate (the best reading: text, score, and the name of a known plate)."))
    labels: list[str] = Field(["car", "bus", "truck"], min_length=1, description="Detector labels that have plates.")
    interval_s: float = Field(1.0, gt=0, le=3600, description="Per track: media seconds between two readings.")
    max_per_frame: int = Field(1, ge=1, le=64, description="Vehicles read per analysed frame at most (largest first).")
    max_wait_s: float = Field(0.25, ge=0, le=10, description=(
        "How long a frame waits for its stream's reading; a longer one is applied to a later frame."))
    min_score: float = Field(0.6, ge=0, le=1, description="Readings below this confidence are ignored.")
    settle_score: float = Field(0.95, ge=0, le=1, description=(
        "A track read this confidently is not read again; not below min_score (a reading under min_score is never "
        "kept, so it could not settle anything)."))
    known: dict[str, str] = Field(default_factory=dict, description=(
        "Known plates and their names, e.g. {'AB12CDE': \"Alice's car\"}; compared without spaces, dashes or case, "
        "so each must be 4-10 letters and digits with a digit once those are dropped (what the reader keeps), and "
        "two spellings of one plate may not have two names."))

    @field_validator("settle_score")
    @classmethod
    def _settle(cls, value: float, info: ValidationInfo) -> float:
        min_score = info.data.get("min_score")
        if min_score is not None and value < min_score:
            raise ValueError(f"settle_score {value} is below min_score {min_score}: a reading under min_score is "
                             "never kept, so nothing would settle a track below it; set settle_score >= min_score")
        return value

    @field_validator("known")
    @classmethod
    def _plates(cls, value: dict[str, Any]) -> dict[str, Any]:
        for plate, name in value.items():
            if not any(c.isalnum() for c in plate) or not 0 < len(plate) <= 32 or not 0 < len(str(name)) <= 100:
                raise ValueError(f"known: {plate!r}: a plate of 1-32 characters with letters or digits, a name of "
                                 "1-100 characters")
        check_known(value)
        return value


def normalise_plate(text: str) -> str:
    """Upper case, letters and digits only: 'ab 12-cd' -> 'AB12CD' (how plates are compared and searched)."""
    return _NOT_PLATE.sub("", text.upper())


def check_known(known: Mapping[str, str]) -> None:
    """Raises ValueError naming the plate when a known plate can never be read (it is not ``PLATE_RULE``: the
    reader keeps only such lines) or when two known plates are one once normalised but have different names."""
    named: dict[str, str] = {}  # normalised -> the plate as written
    for plate, name in known.items():
        text = normalise_plate(plate)
        if not _PLATE.match(text):
            raise ValueError(f"{plate!r} can never be read as a plate: a plate is {PLATE_RULE}")
        if text in named and known[named[text]] != name:
            raise ValueError(f"{named[text]!r} and {plate!r} are one plate ({text}) once spaces, dashes and case are "
                             f"dropped, with two names ({known[named[text]]!r}, {name!r}): keep one")
        named[text] = plate


def detector_labels(detector: object) -> tuple[frozenset[str] | None, bool]:
    """The labels a loaded detector can report (its class names, less those its ``classes`` filter drops; None when
    it does not say), and whether a ``classes`` filter dropped any."""
    names = getattr(detector, "names", None)  # openvino, triton, opencv-ssd: {class id: name}
    if names is None:
        names = getattr(getattr(detector, "model", None), "names", None)  # ultralytics
    if not isinstance(names, Mapping) or not names:
        return None, False
    classes = getattr(detector, "classes", None)
    kept = {int(k): str(v) for k, v in names.items() if classes is None or int(k) in set(classes)}
    return frozenset(kept.values()), len(kept) < len(names)


def label_problems(labels: Collection[str], detector_name: str, available: frozenset[str] | None,
                   filtered: bool = False) -> list[str]:
    """What ``video.plates.labels`` asks of a detector that reports ``available`` (None: unknown, nothing to say),
    as warnings naming the key: labels it does not have, or no vehicle at all (then no plate is ever read)."""
    if available is None:
        return []
    missing = [label for label in labels if label not in available]
    if len(missing) == len(labels):
        where = " (models.detector.classes keeps only these)" if filtered else ""
        shown = ", ".join(sorted(available)[:12]) + (", ..." if len(available) > 12 else "")
        return [f"video.plates.enabled: the detector {detector_name} has no vehicle of video.plates.labels "
                f"({', '.join(labels)}); its labels: {shown}{where}. No plate will be read: use a detector with "
                "vehicles (models.detector.backend: opencv-ssd, or COCO YOLO weights)"]
    if missing:
        read = ", ".join(label for label in labels if label not in missing)
        return [f"video.plates.labels: {', '.join(repr(label) for label in missing)} not a label of the detector "
                f"{detector_name}: no such track ever comes (plates are read for {read} only)"]
    return []


@dataclass(frozen=True, slots=True)
class PlateReading:
    text: str  # normalised
    score: float
    name: str | None = None

    def as_message(self) -> dict[str, Any]:
        return {"text": self.text, "score": round(self.score, 3), "name": self.name}


class PlateReader:
    """The text reader and the plate rules, shared by the app's streams (``executor``: one thread)."""

    def __init__(self, reader: TextReader, settings: PlateReadingConfig) -> None:
        self.reader = reader
        self.settings = settings
        self.known = {normalise_plate(plate): name for plate, name in settings.known.items()}
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="plates")

    async def close(self) -> None:
        """With the app (``Engines.close``), after its sessions."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def best(self, lines: list[TextLine]) -> PlateReading | None:
        """The plate-like line read with the highest confidence (at least ``min_score``)."""
        candidates = [(normalise_plate(line.text), line.score) for line in lines]
        candidates = [(text, score) for text, score in candidates
                      if _PLATE.match(text) and score >= self.settings.min_score]
        if not candidates:
            return None
        text, score = max(candidates, key=lambda c: c[1])
        return PlateReading(text, score, self.known.get(text))

    def read(self, image: np.ndarray, box: tuple[float, float, float, float]) -> PlateReading | None:
        """The plate of the vehicle in ``box`` (normalised) of a BGR frame, if one can be read."""
        height, width = image.shape[:2]
        x1, y1 = max(0, int(box[0] * width)), max(0, int(box[1] * height))
        x2, y2 = min(width, int(box[2] * width)), min(height, int(box[3] * height))
        if x2 - x1 < MIN_CROP_PX or y2 - y1 < MIN_CROP_PX:
            return None
        return self.best(self.reader.read(image[y1:y2, x1:x2]))


class StreamPlates(TrackLooks[PlateReading]):
    """One per stream: which vehicles to read on this frame (``pipelines.video.looks``), and each track's best
    reading; a reading of ``settle_score`` or more ends the track's readings."""

    key = "plate"

    def __init__(self, reader: PlateReader) -> None:
        super().__init__(reader.executor, reader.settings)
        self.reader = reader
        self.settle_score = reader.settings.settle_score

    def look(self, frame: av.VideoFrame, due: list[Detection]) -> list[PlateReading | None]:
        image = to_array(frame, "bgr24")  # never frame.to_ndarray: see pipelines.video.frames
        return [self.reader.read(image, d.box) for d in due]

    def settled(self, value: PlateReading | None) -> bool:
        return value is not None and value.score >= self.settle_score

    def keep(self, old: PlateReading | None, new: PlateReading) -> PlateReading:
        return new if old is None or new.score > old.score else old
