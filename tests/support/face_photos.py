"""Real photographs of people for the face tests and bench (issue 22): several different photos of one person are
what recognition needs, and no installed package ships them. The ``face_recognition`` 1.3.0 source distribution
on PyPI (MIT; official White House portraits) carries its test photos: three different photos of Barack Obama
(a portrait, a speech at a podium, a full-length photo in a room), crops of the first, and one of Joe Biden.

``python -m tests.support.face_photos`` (run by ``scripts/setup.sh``, online, outside the test sandbox) downloads
that sdist with pip, checks its sha256 and keeps the photos in ``.cache/face-photos``; tests never download.

The labelled set (``LABELLED``) adds the installed real photos (scikit-image's astronaut, Eileen Collins;
Ultralytics' zidane.jpg and bus.jpg, six more people) as people who are not enrolled.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
PHOTOS_DIR = ROOT / ".cache" / "face-photos"
SDIST = "face_recognition-1.3.0.tar.gz"
SDIST_SHA256 = "5e5efdd1686aa566af0d3cc1313b131e4b197657a8ffd03669e6d3fad92705ec"
PHOTOS = ("obama.jpg", "obama2.jpg", "obama3.jpg", "biden.jpg", "obama_partial_face.jpg", "obama_partial_face2.jpg")


def available() -> bool:
    return all((PHOTOS_DIR / name).is_file() for name in PHOTOS)


def photo_path(name: str) -> Path:
    path = PHOTOS_DIR / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: run scripts/setup.sh (python -m tests.support.face_photos)")
    return path


def photo_bytes(name: str) -> bytes:
    return photo_path(name).read_bytes()


def photo_rgb(name: str) -> np.ndarray:
    import cv2

    return cv2.cvtColor(cv2.imread(str(photo_path(name))), cv2.COLOR_BGR2RGB)


def fetch() -> None:
    if available():
        return
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                        "--no-build-isolation", "-d", tmp, "face-recognition==1.3.0"], check=False)
        sdist = Path(tmp) / SDIST
        if not sdist.is_file():  # pip prepares an sdist's metadata; without setuptools here, take the file it fetched
            raise SystemExit(f"face_photos: pip did not download {SDIST}")
        digest = hashlib.sha256(sdist.read_bytes()).hexdigest()
        if digest != SDIST_SHA256:
            raise SystemExit(f"face_photos: {SDIST} has sha256 {digest}, expected {SDIST_SHA256}")
        PHOTOS_DIR.mkdir(parents=True, exist_ok=True)
        with tarfile.open(sdist) as archive:
            for name in PHOTOS:
                member = archive.extractfile(f"face_recognition-1.3.0/tests/test_images/{name}")
                assert member is not None
                (PHOTOS_DIR / name).write_bytes(member.read())
    print(f"face_photos: {len(PHOTOS)} photos in {PHOTOS_DIR}")


if __name__ == "__main__":
    fetch()


# ---------------------------------------------------------------- the labelled set

ENROLLED = {"Barack": "obama.jpg", "Joe": "biden.jpg"}  # who is enrolled, from which one photo
# Probe photos (none of them enrolled): the largest person in each is who it names, every other person nobody.
PROBES: dict[str, str | None] = {
    "obama2.jpg": "Barack", "obama3.jpg": "Barack", "astronaut": None, "zidane": None, "bus": None,
}


def probe_rgb(name: str) -> np.ndarray:
    if name.endswith(".jpg"):
        return photo_rgb(name)
    from tests.support.media import real_image

    return real_image(name)


def evaluate(detector: Any, recognizer: Any) -> list[tuple[str, int, str | None, str | None]]:
    """(photo, person index, truth, predicted) for every person the detector finds in every probe photo (the
    largest first); predicted None: no frontal face, or one matching nobody."""
    rows = []
    for photo, truth in PROBES.items():
        rgb = probe_rgb(photo)
        people = [d for d in detector.detect([np.ascontiguousarray(rgb[..., ::-1])])[0] if d.label == "person"]
        people.sort(key=lambda d: (d.box[2] - d.box[0]) * (d.box[3] - d.box[1]), reverse=True)
        for index, person in enumerate(people):
            identity = recognizer.identify(rgb, person.box, person.keypoints)
            rows.append((photo, index, truth if index == 0 else None, identity.name if identity else None))
    return rows


def precision_recall(rows: list[tuple[str, int, str | None, str | None]]) -> tuple[float, float, int, int, int]:
    """(precision, recall, true positives, false positives, false negatives) of names given."""
    tp = sum(1 for _, _, truth, got in rows if got is not None and got == truth)
    fp = sum(1 for _, _, truth, got in rows if got is not None and got != truth)
    fn = sum(1 for _, _, truth, got in rows if truth is not None and got != truth)
    precision = tp / (tp + fp) if tp + fp else 1.0
    recall = tp / (tp + fn) if tp + fn else 1.0
    return precision, recall, tp, fp, fn
