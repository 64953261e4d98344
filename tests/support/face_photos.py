"""Real photographs of people for the face tests and bench: several different photos of one person are
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
import time
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


def write_arrivals(path: Path) -> Path:
    """A camera's view as a 10 fps video: nobody, then Barack (obama2.jpg, a photo his enrolment from obama.jpg
    does not use), then 3 s of nobody (longer than a lost track is kept, 2 s: the next person gets a new track),
    then the astronaut (Eileen Collins, whom nobody enrolled)."""
    from tests.support.media import letterbox, real_image, write_video

    empty = np.full((480, 640, 3), 114, np.uint8)
    pictures = [empty] * 5 + [letterbox(photo_rgb("obama2.jpg"), (640, 480))] * 15
    pictures += [empty] * 30 + [letterbox(real_image("astronaut"), (640, 480))] * 15
    return write_video(path, pictures, fps=10)


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


# ---------------------------------------------------------------- the bench's cases (bench/faces.py)

# More people nobody enrolled, in photos that ship inside installed packages: Grace Hopper's portrait (matplotlib's
# sample data) and scikit-image's cameraman (greyscale, his face turned down to his camera).
STRANGERS = ("grace_hopper", "camera")
SMALL_FACE_PX = 50  # the "small" case: the photo shrunk so that its largest face is this wide
TILT_DEGREES = 25


def yaw(keypoints: list[tuple[float, float, float]], width: int, height: int) -> float:
    """How far a face is turned, from the pose keypoints: the nose's offset from the eyes' midpoint, in eye
    distances (0: frontal; ~0.2-0.35 three-quarter; more: towards profile)."""
    (nx, _, _), (lx, ly, _), (rx, ry, _) = keypoints[:3]
    eyes = max(float(np.hypot((lx - rx) * width, (ly - ry) * height)), 1e-6)
    return abs((nx - (lx + rx) / 2) * width) / eyes


def view(keypoints: list[tuple[float, float, float]] | None, width: int, height: int) -> str:
    if keypoints is None or len(keypoints) < 5:
        return "frontal"
    turned = yaw(keypoints, width, height)
    return "frontal" if turned < 0.15 else "three-quarter" if turned < 0.35 else "profile-ish"


def _tilted(rgb: np.ndarray, _: list[Any]) -> np.ndarray:
    import cv2

    height, width = rgb.shape[:2]
    matrix = cv2.getRotationMatrix2D((width / 2, height / 2), TILT_DEGREES, 1.0)
    return cv2.warpAffine(rgb, matrix, (width, height), borderMode=cv2.BORDER_REPLICATE)


def _face_px(person: Any, width: int, height: int) -> float:
    from pipelines.video.faces import face_region

    region = face_region(person.box, person.keypoints, width, height, 1)
    return region[1] if region else 0.45 * (person.box[2] - person.box[0]) * width


def _small(rgb: np.ndarray, people: list[Any]) -> np.ndarray:
    import cv2

    largest = max((_face_px(p, rgb.shape[1], rgb.shape[0]) for p in people), default=0.0)
    scale = min(1.0, SMALL_FACE_PX / largest) if largest else 1.0
    return cv2.resize(rgb, (round(rgb.shape[1] * scale), round(rgb.shape[0] * scale)), interpolation=cv2.INTER_AREA)


def _dim(rgb: np.ndarray, _: list[Any]) -> np.ndarray:
    """An evening porch: gamma 2.2 and a third of the light (the face's mid-tones fall to ~20/255)."""
    return np.clip(255.0 * (rgb / 255.0) ** 2.2 * 0.35, 0, 255).astype(np.uint8)


def _covered(rgb: np.ndarray, people: list[Any]) -> np.ndarray:
    """A grey bar over every face from just under the nose to the chin (a scarf, a mask, a hand)."""
    out = rgb.copy()
    height, width = rgb.shape[:2]
    for person in people:
        if person.keypoints is None:
            continue
        nose_x, nose_y = person.keypoints[0][0] * width, person.keypoints[0][1] * height
        face = _face_px(person, width, height)
        x1, x2 = int(nose_x - 0.6 * face), int(nose_x + 0.6 * face)
        y1, y2 = int(nose_y + 0.12 * face), int(nose_y + 0.75 * face)
        out[max(0, y1):max(0, y2), max(0, x1):max(0, x2)] = 128
    return out


# Case name -> how the probe photo is changed (given the people found in the original); "as taken" is split by
# each person's view (frontal, three-quarter, profile-ish) measured from the pose keypoints.
CHANGES: dict[str, Any] = {"tilted": _tilted, "small": _small, "dim": _dim, "covered": _covered}


BARACK = ("obama.jpg", "obama2.jpg", "obama3.jpg")  # three different photos of one man: each enrols him in turn


def case_probes(enrolled_from: str, strangers_too: bool) -> dict[str, str | None]:
    """The probe photos when Barack was enrolled from ``enrolled_from``: his two other photos, and (once) every
    photo of people nobody enrolled."""
    probes: dict[str, str | None] = {photo: "Barack" for photo in BARACK if photo != enrolled_from}
    if strangers_too:
        probes.update({photo: None for photo, truth in PROBES.items() if truth is None})
        probes.update(dict.fromkeys(STRANGERS))
    return probes


def evaluate_cases(detector: Any, recognizers: dict[str, Any], photos: dict[str, str | None]) -> list[dict[str, Any]]:
    """For every probe photo (-> who its largest person is) and every case, every person the detector finds (the
    largest first), identified by each recognizer: rows of {case, photo, index, truth, <recognizer name>: (name
    or None, face found, ms, similarity to the best-matching enrolled face or None)}."""
    rows = []
    for photo, truth in photos.items():
        original = probe_rgb(photo)
        found = _sorted_people(detector, original)
        variants = [("as taken", original)] + [(case, change(original, found)) for case, change in CHANGES.items()]
        for case, rgb in variants:
            people = found if case in ("as taken", "dim", "covered") else _sorted_people(detector, rgb)
            for index, person in enumerate(people):
                label = view(person.keypoints, rgb.shape[1], rgb.shape[0]) if case == "as taken" else case
                row: dict[str, Any] = {"case": label, "photo": photo, "index": index,
                                       "truth": truth if index == 0 else None}
                for name, recognizer in recognizers.items():
                    started = time.perf_counter()
                    identity = recognizer.identify(rgb, person.box, person.keypoints)
                    row[name] = (identity.name if identity else None, identity is not None,
                                 (time.perf_counter() - started) * 1000.0, identity.score if identity else None)
                rows.append(row)
    return rows


def _sorted_people(detector: Any, rgb: np.ndarray) -> list[Any]:
    people = [d for d in detector.detect([np.ascontiguousarray(rgb[..., ::-1])])[0] if d.label == "person"]
    return sorted(people, key=lambda d: (d.box[2] - d.box[0]) * (d.box[3] - d.box[1]), reverse=True)
