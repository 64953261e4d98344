"""``video.faces`` and ``video.plates``: who is this person (enrolled faces) and which car (licence plates). Both
are off by default; ``enabled: true`` is the one key that turns each on."""

from __future__ import annotations

from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from models.faces import FACE_MODELS
from models.plates import TEXT_READERS
from pipelines.video.plates import check_known
from server.config.base import Section

FaceModel = FACE_MODELS.config_type()  # default dlib, as server.config.models names its kinds' unions
TextReaderModel = TEXT_READERS.config_type()  # default rapidocr


class FacesSettings(Section):
    enabled: bool = Field(False, description=(
        "Recognise enrolled people (POST /api/faces/{name}) on tracked persons: tracks, their events and timeline "
        "entries carry identity (name and score, or name null: a face that matches nobody)."))
    model: FaceModel = Field(default_factory=FACE_MODELS.default_config, description="The face model (backend: dlib).")
    threshold: float = Field(0.92, ge=-1, le=1, description=(
        "Cosine similarity of two face embeddings from which they are the same person (dlib's ResNet: 0.92 is its "
        "author's Euclidean distance 0.4 on unit vectors, stricter than his 0.6: fewer wrong names, more unknowns)."))
    interval_s: float = Field(1.0, gt=0, le=3600, description=(
        "Per track: media seconds between two looks at its face until it is recognised (then never again); the "
        "interval doubles after each look that finds no name, up to 8 times."))
    max_per_frame: int = Field(2, ge=1, le=64, description=(
        "Faces looked at per analysed frame at most (the largest persons first): bounds the cost of a crowd."))
    max_wait_s: float = Field(0.25, ge=0, le=10, description=(
        "How long a frame waits for its stream's look, so that a name found at once is on that frame's events; a "
        "look that takes longer is applied to a later frame (detection never waits behind faces)."))
    min_face_px: int = Field(40, ge=16, le=1000, description="Faces narrower than this (frame pixels) are ignored.")
    labels: list[str] = Field(["person"], min_length=1, description="Detector labels whose tracks have faces.")
    max_image_pixels: int = Field(40_000_000, ge=1_000_000, le=150_000_000, description=(
        "The largest enrolment photo (POST /api/faces/{name}), in pixels, read from its header before anything is "
        "decoded: a larger one is refused (400 image_too_large). A 110 KB one-colour PNG can say 30000x30000, "
        "2.7 GB once decoded; 40 megapixels (a 7300x5500 camera photo) decode to 120 MB."))


class PlatesSettings(Section):
    enabled: bool = Field(False, description=(
        "Read licence plates of vehicle tracks (needs a detector with vehicles: opencv-ssd, or a COCO YOLO): tracks "
        "and their events carry plate (the best reading: text, score, and the name of a known plate)."))
    model: TextReaderModel = Field(default_factory=TEXT_READERS.default_config,
                                   description="The text reader (backend: rapidocr).")
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
