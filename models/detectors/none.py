"""``backend: none``: no detector; sessions only count frames."""

from __future__ import annotations

from typing import Literal

from models.detectors import DETECTORS
from models.registry import BackendConfig


class NoDetectorConfig(BackendConfig):
    backend: Literal["none"] = "none"


@DETECTORS.register(NoDetectorConfig)
def build(config: NoDetectorConfig) -> None:
    return None
