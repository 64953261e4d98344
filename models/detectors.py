"""The detector backends, registered by name (``models/detector_backends/``: one module each, declaring its
config and its builder). ``load_detector`` builds the configured one; whoever calls it owns the result (the
app's engines), so there is no process-wide cache here."""

from __future__ import annotations

import importlib
import pkgutil

from models import detector_backends
from models.detector import Detector
from models.registry import BackendConfig, Registry

DETECTORS: Registry[Detector | None] = Registry("detector", default="yolo")


def load_detector(config: BackendConfig) -> Detector | None:
    """The configured detector (blocking: loads weights); None for ``backend: none``."""
    return DETECTORS.build(config)


for _module in pkgutil.iter_modules(detector_backends.__path__):  # each registers itself on import
    importlib.import_module(f"{detector_backends.__name__}.{_module.name}")
