"""The detector backends, registered by name (``models/detector_backends/``: one module each, declaring its
config and its builder). ``load_detector`` builds the configured one; whoever calls it owns the result (the
app's engines), so there is no process-wide cache here."""

from __future__ import annotations

from models import detector_backends
from models.detector import Detector
from models.registry import BackendConfig, Registry

DETECTORS: Registry[Detector | None] = Registry("detector", default="yolo")


def load_detector(config: BackendConfig) -> Detector | None:
    """The configured detector (blocking: loads weights); None for ``backend: none``."""
    return DETECTORS.build(config)


DETECTORS.discover(detector_backends)  # each module registers itself on import
