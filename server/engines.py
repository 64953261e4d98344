"""Model engines built from the config: loaded once per process, shared by every session and source."""

from __future__ import annotations

import logging

from models.detectors import load_detector
from pipelines.video.analyzer import DetectorVideoAnalyzer
from pipelines.video.batcher import InferenceBatcher
from server.config import Settings
from server.sessions import Analyzers

log = logging.getLogger(__name__)


def build_analyzers(settings: Settings) -> Analyzers:
    """Load the configured models (blocking, seconds); raises ModelNotAvailable with a how-to message."""
    detector_config = settings.models.detector
    if detector_config.backend == "none":
        return Analyzers()
    detector = load_detector(
        detector_config.backend,
        weights=detector_config.weights,
        device=detector_config.device,
        imgsz=detector_config.imgsz,
        conf=detector_config.conf,
        half=detector_config.half,
        classes=detector_config.classes,
    )
    log.info("detector %s loaded on %s", detector.name, detector.device)
    batcher = InferenceBatcher(detector, max_batch=settings.video.max_batch, max_wait_ms=settings.video.max_wait_ms)
    return Analyzers(video=lambda: DetectorVideoAnalyzer(batcher), closers=[batcher.close])
