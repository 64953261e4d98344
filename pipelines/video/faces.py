"""Who is this person: enrolled faces (``FaceGallery``, on disk under ``storage.data_dir``), recognition
(``FaceRecognizer``: a face crop from a tracked person, its embedding, the best match) and, per stream, when to
look (``StreamFaces``, with ``pipelines.video.looks``: at most once per ``interval_s`` per track, less often
while unknown, at most ``max_per_frame`` faces per analysed frame, on the faces thread, never the event loop).

The face crop comes from the person's pose keypoints (the default detector, yolo11n-pose, gives nose, eyes and
ears): a person whose nose and both eyes are not all visible is not facing the camera and is not looked at. The
crop, scaled so the face is about ``FACE_PX`` pixels wide, goes through the face model's detector (CenterFace by
default, or dlib's HOG), which also refuses profiles and blurred faces; a detector without keypoints (SSD) gives
the top of the person's box.

A track recognised once keeps its name for as long as it lives (a later, worse view does not undo it); a face
that matches nobody is ``unknown`` (name null) and is looked at again later; a deleted person's name is taken
back from live tracks at the next frame. Embeddings and images never go to logs or metrics.

An uploaded photo's size is read from its header before anything is decoded: one past ``max_image_pixels`` is
refused (``image_too_large``), as a 110 KB PNG can decode to gigabytes. A photo is stored re-encoded from its
pixels, without its metadata (EXIF: camera, place, author; XMP, ICC, text chunks).
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
import shutil
import struct
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from models.detectors import Detection
from models.faces import FaceBox, FaceModel
from pipelines.errors import ApiError
from pipelines.video.frames import to_array
from pipelines.video.looks import TrackLooks

log = logging.getLogger(__name__)

KEYPOINT_CONF = 0.5  # a pose keypoint counts as visible from this confidence
# A face turned three-quarters away has its far eye scored lower by the pose model (zidane.jpg's man on the left:
# 0.46) though it shows: the eyes count from this, so that such faces are looked at (CenterFace finds them).
EYE_CONF = 0.3
FACE_EYES = 2.5  # a face is about this many eye distances wide (the pose keypoints' and the landmarks' estimate)
FACE_PX = 110  # the face's width in the crop given to HOG (its window is 80 px; dlib's chips are 150 px)
MAX_UPSCALE = 4.0
MAX_IMAGE_SIDE = 2000  # enrolment photos are shrunk to this first (HOG's cost grows with the pixels)
MAX_IMAGE_PIXELS = 40_000_000  # the default of video.faces.max_image_pixels
JPEG_QUALITY = 95  # stored photos, re-encoded without their metadata
NEGATIVES = "negatives.npy"  # in a person's folder: faces marked "not this person"
NAME = re.compile(r"^\w[\w .'\-]{0,63}$")
_NOSE, _LEFT_EYE, _RIGHT_EYE, _LEFT_EAR, _RIGHT_EAR = range(5)


class FaceRecognitionConfig(BaseModel):
    """Face recognition's knobs, declared once: ``video.faces`` in the server's config is this model (and the
    face model's backend)."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(False, description=(
        "Recognise enrolled people (POST /api/faces/{name}) on tracked persons: tracks, their events and timeline "
        "entries carry identity (name and score, or name null: a face that matches nobody)."))
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
    max_image_pixels: int = Field(MAX_IMAGE_PIXELS, ge=1_000_000, le=150_000_000, description=(
        "The largest enrolment photo (POST /api/faces/{name}), in pixels, read from its header before anything is "
        "decoded: a larger one is refused (400 image_too_large). A 110 KB one-colour PNG can say 30000x30000, "
        "2.7 GB once decoded; 40 megapixels (a 7300x5500 camera photo) decode to 120 MB."))


@dataclass(frozen=True, slots=True)
class Identity:
    name: str | None  # None: a face was seen and matches nobody enrolled
    score: float  # cosine similarity to the best-matching enrolled face

    def as_message(self) -> dict[str, Any]:
        return {"name": self.name, "score": round(self.score, 3)}


def check_name(name: str) -> str:
    if not NAME.match(name) or name != name.strip():
        raise ApiError("invalid_name", "a name is 1-64 letters, digits, spaces or . ' - _ (starting with a letter or "
                       "digit)", param="name")
    return name


# ---------------------------------------------------------------- the enrolment store


@dataclass
class Person:
    name: str
    embeddings: np.ndarray  # (n, d) unit vectors, one per image, in the images' order
    images: list[str] = field(default_factory=list)  # file names inside the person's folder
    # Faces wrongly given this name ("not this person"): a face nearer one of them than any of the person's own
    # photos is not named.
    negatives: np.ndarray | None = None

    def info(self) -> dict[str, Any]:
        return {"name": self.name, "faces": len(self.embeddings)}

    def negative_count(self) -> int:
        return 0 if self.negatives is None else len(self.negatives)


class FaceGallery:
    """Enrolled people under ``root``: one folder per person (named by a hash of the name, so no name is ever a
    path) holding ``person.json`` (the name and image files), ``embeddings.npy`` and the enrolment images.
    Thread-safe; ``version`` changes with every enrolment or deletion."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()
        self._people: dict[str, Person] = {}
        self._matrix = np.zeros((0, 0), np.float32)
        self._owners: list[str] = []
        self.version = 0
        self._load()

    def _folder(self, name: str) -> Path:
        return self.root / hashlib.sha256(name.encode()).hexdigest()[:24]

    def _load(self) -> None:
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir()):
            try:
                meta = json.loads((folder / "person.json").read_text())
                embeddings = np.load(folder / "embeddings.npy")
                negatives = np.load(folder / NEGATIVES).astype(np.float32) if (folder / NEGATIVES).is_file() else None
                self._people[meta["name"]] = Person(meta["name"], embeddings.astype(np.float32), meta["images"],
                                                    negatives)
            except (OSError, ValueError, KeyError) as error:  # a half-written folder: skip it, say which
                log.warning("faces: %s not loaded: %s", folder.name, type(error).__name__)
                continue
            if not meta.get("stripped"):  # enrolled before photos were stored without their metadata
                _strip_stored_photos(folder, meta)
        self._reindex()

    def _reindex(self) -> None:
        people = [p for p in self._people.values() if len(p.embeddings)]
        self._owners = [p.name for p in people for _ in range(len(p.embeddings))]
        self._matrix = np.concatenate([p.embeddings for p in people]) if people else np.zeros((0, 0), np.float32)
        self.version += 1

    def person(self, name: str) -> Person | None:
        with self._lock:
            return self._people.get(name)

    def people(self) -> list[Person]:
        with self._lock:
            return sorted(self._people.values(), key=lambda p: p.name.casefold())

    def names(self) -> set[str]:
        with self._lock:
            return set(self._people)

    def add(self, name: str, embeddings: np.ndarray, images: Sequence[tuple[bytes, str]]) -> Person:
        """Append ``embeddings`` and their ``images`` (bytes, extension) to ``name`` (created if new)."""
        with self._lock:
            folder = self._folder(name)
            folder.mkdir(parents=True, exist_ok=True)
            person = self._people.get(name) or Person(name, np.zeros((0, embeddings.shape[1]), np.float32))
            files = list(person.images)
            number = max((int(f.split(".")[0]) for f in files), default=0)  # never a removed photo's number
            for data, extension in images:
                number += 1
                file = f"{number:04d}.{extension}"
                _write_atomic(folder / file, data)
                files.append(file)
            stacked = np.concatenate([person.embeddings, embeddings.astype(np.float32)])
            return self._store(folder, Person(name, stacked, files, person.negatives))

    def _store(self, folder: Path, person: Person) -> Person:
        """Write ``person``'s embeddings, negatives and list of photos (each file replaced whole); lock held."""
        _write_npy(folder / "embeddings.npy", person.embeddings)
        if person.negatives is not None:
            _write_npy(folder / NEGATIVES, person.negatives)
        meta = {"name": person.name, "images": person.images, "stripped": True}  # stripped: no photo metadata
        _write_atomic(folder / "person.json", json.dumps(meta).encode())
        self._people[person.name] = person
        self._reindex()
        return person

    def photo_path(self, name: str, photo_id: str) -> Path | None:
        """The stored file of one of ``name``'s photos (its id: the file name without extension)."""
        with self._lock:
            person = self._people.get(name)
            file = next((f for f in person.images if f.split(".")[0] == photo_id), None) if person else None
            return self._folder(name) / file if file else None

    def add_negative(self, name: str, embedding: np.ndarray) -> Person | None:
        """Keep ``embedding`` as a face that is not ``name`` (None: nobody has that name)."""
        with self._lock:
            person = self._people.get(name)
            if person is None:
                return None
            negatives = embedding[None, :].astype(np.float32)
            if person.negatives is not None:
                negatives = np.concatenate([person.negatives, negatives])
            return self._store(self._folder(name), Person(name, person.embeddings, person.images, negatives))

    def remove_photo(self, name: str, photo_id: str) -> Person | None:
        """Delete one photo of ``name`` and its embedding (None: no such person or photo). The last photo is
        refused: deleting the person (``delete``) is what forgets them."""
        with self._lock:
            person = self._people.get(name)
            files = [f.split(".")[0] for f in person.images] if person is not None else []
            if person is None or photo_id not in files:
                return None
            if len(files) == 1:
                raise ApiError("conflict", "this is the person's last photo: delete the person instead "
                               "(DELETE /api/faces/{name}), which also takes their name from the timeline")
            index = files.index(photo_id)
            folder = self._folder(name)
            kept = Person(name, np.delete(person.embeddings, index, axis=0),
                          [f for i, f in enumerate(person.images) if i != index], person.negatives)
            self._store(folder, kept)
            (folder / person.images[index]).unlink(missing_ok=True)
            return kept

    def delete(self, name: str) -> Person | None:
        """Remove every embedding and image of ``name``; returns what was removed (None: nobody has that name)."""
        with self._lock:
            person = self._people.pop(name, None)
            if person is None:
                return None
            shutil.rmtree(self._folder(name), ignore_errors=True)
            self._reindex()
            return person

    def match(self, embedding: np.ndarray) -> tuple[str | None, float]:
        """The enrolled person most similar to ``embedding`` and the similarity (None, -1 with nobody enrolled);
        None with the similarity when the face is nearer one of that person's negatives than to their photos."""
        with self._lock:
            if not self._owners:
                return None, -1.0
            similarities = self._matrix @ embedding
            best = int(np.argmax(similarities))
            name, score = self._owners[best], float(similarities[best])
            negatives = self._people[name].negatives
            if negatives is not None and len(negatives) and float(np.max(negatives @ embedding)) >= score:
                return None, score
            return name, score


def _write_npy(path: Path, array: np.ndarray) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npy", delete=False) as handle:
        np.save(handle, array)
    os.replace(handle.name, path)


def _write_atomic(path: Path, data: bytes) -> None:
    with tempfile.NamedTemporaryFile(dir=path.parent, delete=False) as handle:
        handle.write(data)
    os.replace(handle.name, path)


def _strip_stored_photos(folder: Path, meta: dict[str, Any]) -> None:
    """Re-encode the photos of a person enrolled before photos were stored without their metadata (once)."""
    import cv2

    for file in meta["images"]:
        path = folder / file
        bgr = cv2.imread(str(path), cv2.IMREAD_COLOR)  # EXIF orientation applied: the photo looks as it did
        if bgr is None:
            log.warning("faces: a stored photo of %s does not decode; left as it is", folder.name)
            return
        _write_atomic(path, encode_photo(bgr, path.suffix.lstrip(".")))
    _write_atomic(folder / "person.json", json.dumps({**meta, "stripped": True}).encode())
    log.info("faces: %d stored photo(s) of %s re-encoded without their metadata", len(meta["images"]), folder.name)


def encode_photo(bgr: np.ndarray, extension: str) -> bytes:
    """A photo as stored: its pixels alone, re-encoded (no EXIF, XMP, ICC profile or text chunks)."""
    import cv2

    params = [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY] if extension == "jpg" else []
    ok, encoded = cv2.imencode(f".{extension}", bgr, params)
    if not ok:
        raise ValueError(f"{extension} encoding failed")
    return encoded.tobytes()


# ---------------------------------------------------------------- recognition


def image_header(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS, what: str = "the image") -> tuple[int, int, str]:
    """(width, height, file extension) of a JPEG or PNG upload, from its header alone (no pixel is decoded);
    anything else, a header that does not parse, or more than ``max_pixels`` pixels is refused."""
    from PIL import JpegImagePlugin, PngImagePlugin

    if data[:3] == b"\xff\xd8\xff":
        extension, opener = "jpg", JpegImagePlugin.JpegImageFile
    elif data[:8] == b"\x89PNG\r\n\x1a\n":
        extension, opener = "png", PngImagePlugin.PngImageFile
    else:
        raise ApiError("invalid_image", f"{what}: not a JPEG or PNG image")
    kind = extension.upper().replace("JPG", "JPEG")
    try:
        # The format's own class, not Image.open: it reads the header (a PNG's IHDR, a JPEG's markers up to its
        # frame header) and decodes nothing, without Pillow's own decompression-bomb check (a warning from 89
        # megapixels, an error from 179), which this limit replaces.
        with opener(io.BytesIO(data)) as image:
            width, height = image.size
    except (OSError, SyntaxError, ValueError, IndexError, TypeError, EOFError, struct.error):
        raise ApiError("invalid_image", f"{what}: the {kind} header cannot be read") from None
    if width <= 0 or height <= 0:
        raise ApiError("invalid_image", f"{what}: the {kind} image is {width}x{height}")
    if width * height > max_pixels:
        raise ApiError("image_too_large", f"{what}: the {kind} image is {width}x{height} ({width * height} pixels); "
                       f"at most {max_pixels} pixels are decoded (video.faces.max_image_pixels)")
    return width, height, extension


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS, what: str = "the image") -> tuple[np.ndarray, str]:
    """A JPEG or PNG upload as RGB (shrunk to MAX_IMAGE_SIDE) and its file extension; anything else, or an image
    of more than ``max_pixels`` pixels (read from its header, before decoding), is refused."""
    import cv2

    _, _, extension = image_header(data, max_pixels, what)
    try:
        bgr = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_COLOR)
    except cv2.error:  # e.g. OpenCV's own size limit: a header Pillow read differently
        bgr = None
    if bgr is None or bgr.size == 0:
        raise ApiError("invalid_image", f"{what}: the {extension.upper()} image cannot be decoded")
    scale = MAX_IMAGE_SIDE / max(bgr.shape[:2])
    if scale < 1:
        bgr = cv2.resize(bgr, (round(bgr.shape[1] * scale), round(bgr.shape[0] * scale)), interpolation=cv2.INTER_AREA)
    return cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB), extension


class FaceRecognizer:
    """The face model and the gallery, shared by the app's streams and its enrolment API. Blocking methods: call
    them from a worker thread (the streams use ``executor``, one thread: faces never take more than one core)."""

    def __init__(self, model: FaceModel, gallery: FaceGallery, settings: FaceRecognitionConfig) -> None:
        self.model = model
        self.gallery = gallery
        self.settings = settings
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="faces")

    async def close(self) -> None:
        """With the app (``Engines.close``), after its sessions."""
        self.executor.shutdown(wait=False, cancel_futures=True)

    def the_face(self, image: np.ndarray, what: str) -> FaceBox:
        """The one face of an enrolment photo; a photo with none or several is refused."""
        faces = self.model.find(image, upsample=1 if max(image.shape[:2]) <= 1000 else 0)
        if not faces:
            raise ApiError("no_face", f"{what}: no face found (a face showing both eyes, at least ~40 px wide, "
                           "is needed)")
        if len(faces) > 1:
            raise ApiError("several_faces", f"{what}: {len(faces)} faces found; enrol from a photo of one person")
        return faces[0]

    def enrol(self, name: str, images: Sequence[bytes]) -> Person:
        """Embed the one face of every image, then store them all (nothing is stored if any image is refused).
        Every image's header is checked before any is decoded; each is stored re-encoded, without metadata."""
        import cv2

        check_name(name)
        if not images:
            raise ApiError("invalid_image", "no image given")
        whats = [f"image {index + 1}" if len(images) > 1 else "the image" for index in range(len(images))]
        for data, what in zip(images, whats, strict=True):
            image_header(data, self.settings.max_image_pixels, what)
        embeddings, kept = [], []
        for data, what in zip(images, whats, strict=True):
            image, extension = decode_image(data, self.settings.max_image_pixels, what)
            embeddings.append(self.model.embed(image, self.the_face(image, what)))
            kept.append((encode_photo(cv2.cvtColor(image, cv2.COLOR_RGB2BGR), extension), extension))
        person = self.gallery.add(name, np.stack(embeddings), kept)
        log.info("faces: %d face(s) enrolled (%d people enrolled)", len(kept), len(self.gallery.names()))
        return person

    def enrol_from_snapshot(self, name: str, snapshot: bytes, box: Sequence[float]) -> Person:
        """Enrol ``name`` from what a camera saw: the face of the person in ``box`` (normalised) of an event's
        snapshot; the photo stored is that face with a margin (not the whole scene). The box is cut 3 px inside,
        as the snapshot has the box drawn on it."""
        import cv2

        check_name(name)
        person, face = self.snapshot_face(snapshot, box)
        embedding = self.model.embed(person, face)
        margin = face.width // 2
        crop = person[max(0, face.top - margin):face.bottom + margin, max(0, face.left - margin):face.right + margin]
        stored = encode_photo(cv2.cvtColor(np.ascontiguousarray(crop), cv2.COLOR_RGB2BGR), "jpg")
        enrolled = self.gallery.add(name, embedding[None, :], [(stored, "jpg")])
        log.info("faces: a face enrolled from an event (%d people enrolled)", len(self.gallery.names()))
        return enrolled

    def snapshot_face(self, snapshot: bytes, box: Sequence[float]) -> tuple[np.ndarray, FaceBox]:
        """The person's crop (RGB) in ``box`` (normalised) of an event's snapshot and the face found on it."""
        image, _ = decode_image(snapshot, self.settings.max_image_pixels, "the event's snapshot")
        height, width = image.shape[:2]
        x1, y1 = max(0, int(box[0] * width) + 3), max(0, int(box[1] * height) + 3)
        x2, y2 = min(width, int(box[2] * width) - 3), min(height, int(box[3] * height) - 3)
        person = np.ascontiguousarray(image[y1:y2, x1:x2])
        if person.shape[0] < self.settings.min_face_px or person.shape[1] < self.settings.min_face_px:
            raise ApiError("no_face", f"the event's person is {x2 - x1}x{y2 - y1} px: too small for a face")
        # A camera's face is small: look at the person twice as large when the crop is (as enrolment does).
        upsample = 1 if max(person.shape[:2]) <= 1000 else 0
        faces = [f for f in self.model.find(person, upsample=upsample)
                 if (f.top + f.bottom) / 2 < 0.6 * person.shape[0]]  # a face low in a box is someone else's
        if not faces:
            raise ApiError("no_face", "no face found on the event's person (turned away, covered or too small)")
        face = max(faces, key=lambda f: f.width)
        if face.width < self.settings.min_face_px:
            raise ApiError("no_face", f"the face on the event's snapshot is {face.width} px wide; at least "
                           f"{self.settings.min_face_px} (video.faces.min_face_px) are needed")
        return person, face

    def not_this_person(self, name: str, snapshot: bytes, box: Sequence[float]) -> Person:
        """The face on an event's snapshot was wrongly named ``name``: keep its embedding as their negative."""
        person = self.gallery.person(name)
        if person is None:
            raise ApiError("not_found", "nobody is enrolled under the name the event carries")
        crop, face = self.snapshot_face(snapshot, box)
        marked = self.gallery.add_negative(name, self.model.embed(crop, face))
        if marked is None:  # deleted meanwhile
            raise ApiError("not_found", "nobody is enrolled under the name the event carries")
        log.info("faces: a face marked as not an enrolled person")
        return marked

    def found_face_px(self, face: FaceBox) -> float:
        """The width ``min_face_px`` is held to once the face is found: the width ``face_region`` let through, from
        the face's own landmarks. CenterFace's box is ~15 % narrower, and held to it a face ``face_region`` sized at
        40-45 px was refused after it was found (the faces bench's small faces: 3 of 10 at 40 px found, 8 so)."""
        return face_px_from_landmarks(face)

    def identify(self, image: np.ndarray, box: tuple[float, float, float, float],
                 keypoints: list[tuple[float, float, float]] | None) -> Identity | None:
        """The identity of the person in ``box`` (normalised) of an RGB frame; None when no frontal face of at
        least ``min_face_px`` shows."""
        import cv2

        region = face_region(box, keypoints, image.shape[1], image.shape[0], self.settings.min_face_px)
        if region is None:
            return None
        (x1, y1, x2, y2), face_px = region
        scale = min(MAX_UPSCALE, FACE_PX / face_px)
        crop = image[y1:y2, x1:x2]
        if crop.size == 0:
            return None
        crop = cv2.resize(crop, (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale))),
                          interpolation=cv2.INTER_LINEAR if scale > 1 else cv2.INTER_AREA)
        faces = self.model.find(crop)
        if not faces:
            return None
        centre = (crop.shape[1] / 2, crop.shape[0] / 2)
        face = min(faces, key=lambda f: ((f.left + f.right) / 2 - centre[0]) ** 2 + ((f.top + f.bottom) / 2
                                                                                     - centre[1]) ** 2)
        if self.found_face_px(face) / scale < self.settings.min_face_px:
            return None
        name, score = self.gallery.match(self.model.embed(crop, face))
        return Identity(name if name is not None and score >= self.settings.threshold else None, max(score, 0.0))


def face_px_from_landmarks(face: FaceBox) -> float:
    """A found face's width as ``face_region`` estimates it before looking (``FACE_EYES`` eye distances), or its
    box's width when wider (a turned face's eyes come closer) or without landmarks (HOG)."""
    if face.landmarks is None:
        return float(face.width)
    (rx, ry), (lx, ly) = face.landmarks[0], face.landmarks[1]
    return max(float(face.width), FACE_EYES * float(np.hypot(lx - rx, ly - ry)))


def face_region(box: tuple[float, float, float, float], keypoints: list[tuple[float, float, float]] | None,
                width: int, height: int, min_face_px: int) -> tuple[tuple[int, int, int, int], float] | None:
    """Where to look for the face of a person (pixels: x1, y1, x2, y2) and the face's expected width; None when
    the person is not facing the camera (nose and both eyes must be visible) or the face is too small."""
    bx1, by1, bx2 = box[0] * width, box[1] * height, box[2] * width
    if keypoints is not None and len(keypoints) >= 5:
        points = [(x * width, y * height, c) for x, y, c in keypoints[:5]]
        if points[_NOSE][2] < KEYPOINT_CONF or min(points[i][2] for i in (_LEFT_EYE, _RIGHT_EYE)) < EYE_CONF:
            return None
        eyes = np.hypot(points[_LEFT_EYE][0] - points[_RIGHT_EYE][0], points[_LEFT_EYE][1] - points[_RIGHT_EYE][1])
        ears = [points[i] for i in (_LEFT_EAR, _RIGHT_EAR) if points[i][2] >= KEYPOINT_CONF]
        face_px = FACE_EYES * eyes
        if len(ears) == 2:
            face_px = max(face_px, 0.9 * np.hypot(ears[0][0] - ears[1][0], ears[0][1] - ears[1][1]))
        cx = (points[_LEFT_EYE][0] + points[_RIGHT_EYE][0] + points[_NOSE][0]) / 3
        cy = (points[_LEFT_EYE][1] + points[_RIGHT_EYE][1] + points[_NOSE][1]) / 3
        half = face_px  # the crop is twice the face: HOG needs the face's outline and some margin
    else:  # no pose: the top of the person's box, as wide as the box
        face_px = 0.45 * (bx2 - bx1)
        half = (bx2 - bx1) / 2
        cx, cy = (bx1 + bx2) / 2, by1 + half
    if face_px < min_face_px:
        return None
    x1, y1 = max(0, int(cx - half)), max(0, int(cy - half))
    x2, y2 = min(width, int(cx + half)), min(height, int(cy + half))
    if x2 - x1 < min_face_px or y2 - y1 < min_face_px:
        return None
    return (x1, y1, x2, y2), float(face_px)


# ---------------------------------------------------------------- per stream


class StreamFaces(TrackLooks[Identity]):
    """One per stream: which persons to look at on this frame (``pipelines.video.looks``), and who each track is.
    A name settles a track for its life; an unknown face is looked at again, less and less often."""

    key = "identity"

    def __init__(self, recognizer: FaceRecognizer) -> None:
        super().__init__(recognizer.executor, recognizer.settings)
        self.recognizer = recognizer
        self._version = recognizer.gallery.version

    def look(self, frame: av.VideoFrame, due: list[Detection]) -> list[Identity | None]:
        image = to_array(frame, "rgb24")  # never frame.to_ndarray: see pipelines.video.frames
        return [self.recognizer.identify(image, d.box, d.keypoints) for d in due]

    def settled(self, value: Identity | None) -> bool:
        return value is not None and value.name is not None

    def refresh(self, tracks: dict[int, Any]) -> None:
        version = self.recognizer.gallery.version
        if version == self._version:
            return
        # Someone was enrolled or deleted: names taken back, unknown faces looked at again now.
        self._version = version
        names = self.recognizer.gallery.names()
        for track in tracks.values():
            if track.value is not None and track.value.name not in names:
                track.value, track.next_pts, track.looks = None, float("-inf"), 0
