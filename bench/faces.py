"""What faces and plates cost (issue 22), beside the detector call they follow, in ONE run on real photos:

* per face: ``FaceRecognizer.identify`` on a person the default pose detector found (the crop from its keypoints,
  dlib's HOG on it, 5-point landmarks, the ResNet embedding, the match), on two different photos of one man;
* per plate: ``PlateReader.read`` (PP-OCRv4 detection + recognition on the vehicle crop) on Ultralytics' bus photo
  with a plate drawn on it, the vehicle found by the SSD detector;
* each beside its detector's own call on the same image (yolo11n-pose for faces, SSD-MobileNetV2 for plates),
  legs alternating A B B A (``--repeats`` calls per leg), so that drift on a shared machine spreads over both.

Then the labelled set of tests/support/face_photos.py: precision and recall of the names given.

Run (about a minute on 2 CPU cores; the photos come from scripts/setup.sh)::

    cd /work/main && .venv/bin/python -m bench.faces
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from models.detectors import load_detector
from models.faces.dlib import DlibFaces, DlibFacesConfig
from models.plates.rapidocr import RapidOcr, RapidOcrConfig
from pipelines.video.faces import FaceGallery, FaceRecognitionConfig, FaceRecognizer
from pipelines.video.plates import PlateReader, PlateReadingConfig
from server.config import load_settings
from tests.support.face_photos import ENROLLED, evaluate, photo_bytes, photo_rgb, precision_recall
from tests.support.media import real_image


def _timed(work: Callable[[], object], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append((time.perf_counter() - started) * 1000.0)
    return times


def _abba(first: Callable[[], object], second: Callable[[], object], repeats: int) -> tuple[list[float], list[float]]:
    a, b = [], []
    for leg in (0, 1, 1, 0):
        (a if leg == 0 else b).extend(_timed(first if leg == 0 else second, repeats))
    return a, b


def _bus_with_plate() -> np.ndarray:
    rgb = real_image("bus").copy()
    x, y, w, h = 430, 615, 200, 52  # on the bus's side, under its "cero emisiones"
    cv2.rectangle(rgb, (x, y), (x + w, y + h), (255, 255, 255), -1)
    cv2.putText(rgb, "AB12 CDE", (x + 10, y + 40), cv2.FONT_HERSHEY_SIMPLEX, 1.3, (0, 0, 0), 3, cv2.LINE_AA)
    return rgb


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10, help="calls per leg (4 legs)")
    args = parser.parse_args()
    settings = load_settings(None, {})
    pose = load_detector(settings.models.detector)
    ssd = load_detector(load_settings(None, {"models": {"detector": {"backend": "opencv-ssd"}}}).models.detector)
    with tempfile.TemporaryDirectory() as tmp:
        faces = FaceRecognitionConfig(enabled=True)
        recognizer = FaceRecognizer(DlibFaces(DlibFacesConfig()), FaceGallery(Path(tmp)), faces)
        for name, photo in ENROLLED.items():
            recognizer.enrol(name, [photo_bytes(photo)])
        rows = [("stage", "image", "ms median", "detector ms", "ratio")]
        for photo in ("obama2.jpg", "obama3.jpg"):
            rgb = photo_rgb(photo)
            bgr = np.ascontiguousarray(rgb[..., ::-1])
            person = max((d for d in pose.detect([bgr])[0] if d.label == "person"),
                         key=lambda d: (d.box[2] - d.box[0]) * (d.box[3] - d.box[1]))
            assert recognizer.identify(rgb, person.box, person.keypoints) is not None, photo
            face_ms, detect_ms = _abba(lambda rgb=rgb, p=person: recognizer.identify(rgb, p.box, p.keypoints),
                                       lambda bgr=bgr: pose.detect([bgr]), args.repeats)
            rows.append(("face", f"{photo} {rgb.shape[1]}x{rgb.shape[0]}", statistics.median(face_ms),
                         statistics.median(detect_ms), statistics.median(face_ms) / statistics.median(detect_ms)))
        reader = PlateReader(RapidOcr(RapidOcrConfig()), PlateReadingConfig(enabled=True))
        bgr = np.ascontiguousarray(_bus_with_plate()[..., ::-1])
        vehicle = next(d for d in ssd.detect([bgr])[0] if d.label in ("bus", "car", "truck"))
        reading = reader.read(bgr, vehicle.box)
        plate_ms, ssd_ms = _abba(lambda: reader.read(bgr, vehicle.box), lambda: ssd.detect([bgr]), args.repeats)
        rows.append(("plate", f"bus.jpg {bgr.shape[1]}x{bgr.shape[0]} ({reading.text if reading else 'unread'})",
                     statistics.median(plate_ms), statistics.median(ssd_ms),
                     statistics.median(plate_ms) / statistics.median(ssd_ms)))
        print(f"{rows[0][0]:<6} {rows[0][1]:<34} {rows[0][2]:>10} {rows[0][3]:>12} {rows[0][4]:>6}")
        for stage, image, ms, det, ratio in rows[1:]:
            print(f"{stage:<6} {image:<34} {ms:>10.1f} {det:>12.1f} {ratio:>6.2f}")
        print(f"(face: yolo11n-pose's call on the same photo; plate: SSD-MobileNetV2's; {args.repeats} calls x 4 "
              f"legs each, A B B A; shared machine: compare ratios, not absolute ms)")
        labelled = evaluate(pose, recognizer)
        precision, recall, tp, fp, fn = precision_recall(labelled)
        print(f"labelled set: {len(labelled)} people in {len({r[0] for r in labelled})} photos, enrolled "
              f"{', '.join(f'{n} ({p})' for n, p in ENROLLED.items())}: precision {precision:.2f}, recall "
              f"{recall:.2f} (tp {tp}, fp {fp}, fn {fn})")
        for photo, index, truth, got in labelled:
            print(f"  {photo:<12} person {index}: truth {truth or '-':<7} got {got or '-'}")
        reader.executor.shutdown()
        recognizer.executor.shutdown()


if __name__ == "__main__":
    main()
