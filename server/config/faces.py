"""``video.faces`` and ``video.plates``: who is this person (enrolled faces) and which car (licence plates). Both
are off by default; ``enabled: true`` is the one key that turns each on. Their knobs are the pipelines'
(``pipelines.video.faces``, ``pipelines.video.plates``); a section adds the model that does the work."""

from __future__ import annotations

from pydantic import Field

from models.faces import FACE_MODELS
from models.plates import TEXT_READERS
from pipelines.video.faces import FaceRecognitionConfig
from pipelines.video.plates import PlateReadingConfig
from server.config.base import Section

FaceModel = FACE_MODELS.config_type()  # default centerface, as server.config.models names its kinds' unions
TextReaderModel = TEXT_READERS.config_type()  # default rapidocr


class FacesSection(FaceRecognitionConfig, Section):
    model: FaceModel = Field(default_factory=FACE_MODELS.default_config, description=(
        "The face model. backend: centerface (default: CenterFace finds turned, tilted and small faces, aligned "
        "by its landmarks for dlib's ResNet) or dlib (dlib's HOG frontal detector: frontal faces of ~80 px and "
        "more); both embed with dlib's ResNet, so a gallery enrolled with one is recognised with the other."))


class PlatesSection(PlateReadingConfig, Section):
    model: TextReaderModel = Field(default_factory=TEXT_READERS.default_config,
                                   description="The text reader (backend: rapidocr).")
