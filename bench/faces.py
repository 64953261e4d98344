"""What faces and plates cost, beside the detector call they follow, in ONE run on real photos:

* per face: ``FaceRecognizer.identify`` on a person the default pose detector found (the crop from its keypoints,
  dlib's HOG on it, 5-point landmarks, the ResNet embedding, the match), on two different photos of one man;
* per plate: ``PlateReader.read`` (PP-OCRv4 detection + recognition on the vehicle crop) on Ultralytics' bus photo
  with a plate drawn on it, the vehicle found by the SSD detector;
* each beside its detector's own call on the same image (yolo11n-pose for faces, SSD-MobileNetV2 for plates),
  legs alternating A B B A (``--repeats`` calls per leg), so that drift on a shared machine spreads over both.

Then the labelled set of tests/support/face_photos.py: precision and recall of the names given; and the same photos
in cases (as taken, split by each person's view measured from the pose keypoints: frontal, three-quarter,
profile-ish; tilted 25°; small: shrunk so the largest face is 50 px; dim; covered: a grey bar over the lower face)
for both face models in one run: the default (CenterFace + dlib's ResNet) and HOG (``backend: dlib``), with the
faces each found, precision and recall of names, the cost per face and the similarities that place the threshold.

Last, small faces by size: every person facing the camera with a face of 80 px or more, the photo shrunk so that
their face is 30, 40, 50, 60 and 80 px wide (as ``face_region`` measures it), found again by the pose model and
looked at by the default face model as it is and as changed (side by side, same people, same run).

Run (about four minutes on 2 CPU cores; the photos come from scripts/setup.sh)::

    cd /work/main && .venv/bin/python -m bench.faces
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")

import argparse
import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np

from models.detectors import load_detector
from models.faces import FaceBox
from models.faces.centerface import CenterFaceConfig, CenterFaceFaces
from models.faces.dlib import DlibFaces, DlibFacesConfig
from models.plates.rapidocr import RapidOcr, RapidOcrConfig
from pipelines.video.faces import (
    FACE_PX,
    FaceGallery,
    FaceRecognitionConfig,
    FaceRecognizer,
    face_region,
)
from pipelines.video.plates import PlateReader, PlateReadingConfig
from server.config import load_settings
from tests.support.face_photos import (
    BARACK,
    CHANGES,
    ENROLLED,
    _sorted_people,
    case_probes,
    evaluate,
    evaluate_cases,
    photo_bytes,
    photo_rgb,
    precision_recall,
    probe_rgb,
)
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
        recognizer = FaceRecognizer(CenterFaceFaces(CenterFaceConfig()), FaceGallery(Path(tmp) / "default"), faces)
        hog = FaceRecognizer(DlibFaces(DlibFacesConfig()), FaceGallery(Path(tmp) / "hog"), faces)
        for name, photo in ENROLLED.items():
            recognizer.enrol(name, [photo_bytes(photo)])
            hog.enrol(name, [photo_bytes(photo)])
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
        _cases(pose, faces, Path(tmp))
        _sizes(pose, faces, Path(tmp))
        reader.executor.shutdown()
        recognizer.executor.shutdown()
        hog.executor.shutdown()


def _cases(pose: object, faces: FaceRecognitionConfig, tmp: Path) -> None:
    """Barack enrolled from each of his three photos in turn (Joe from his one), probed with the other two; the
    strangers once. Both face models in the same run, on the same people."""
    models = {"centerface": CenterFaceFaces(CenterFaceConfig()), "hog": DlibFaces(DlibFacesConfig())}
    rows = []
    for turn, enrolled_from in enumerate(BARACK):
        recognizers = {}
        for name, model in models.items():
            recognizers[name] = FaceRecognizer(model, FaceGallery(tmp / f"{name}-{turn}"), faces)
            recognizers[name].enrol("Barack", [photo_bytes(enrolled_from)])
            recognizers[name].enrol("Joe", [photo_bytes(ENROLLED["Joe"])])
        rows += evaluate_cases(pose, recognizers, case_probes(enrolled_from, strangers_too=turn == 0))
        for recognizer in recognizers.values():
            recognizer.executor.shutdown()
    threshold = faces.threshold
    frame = np.ascontiguousarray(photo_rgb("obama2.jpg")[..., ::-1])
    pose_ms = statistics.median(_timed(lambda: pose.detect([frame]), 5))  # type: ignore[attr-defined]
    cases = list(dict.fromkeys(r["case"] for r in rows))
    people = [f"{r['photo']}#{r['index']}" for r in rows if r["case"] in ("frontal", "three-quarter", "profile-ish")]
    print(f"\ncases: {len(people)} people looked at in {len({r['photo'] for r in rows})} photos (Barack enrolled "
          f"from each of his 3 photos in turn and probed with the 2 others, Joe from biden.jpg; the rest strangers); "
          f"each case changes the same photos; found = a face found and embedded; ms = the median whole look per "
          f"face found (crop, detector, landmarks, embedding, match), beside yolo11n-pose's call on obama2.jpg: "
          f"{pose_ms:.1f} ms")
    header = f"{'case':<14} {'people':>6} {'named?':>6}"
    for name in models:
        header += f" | {name + ' found':>16} {'prec':>5} {'recall':>6} {'ms/face':>7}"
    print(header)
    for case in cases:
        chosen = [r for r in rows if r["case"] == case]
        line = f"{case:<14} {len(chosen):>6} {sum(1 for r in chosen if r['truth']):>6}"
        for name in models:
            precision, recall, *_ = precision_recall([(r["photo"], r["index"], r["truth"], r[name][0])
                                                      for r in chosen])
            found = [r[name] for r in chosen if r[name][1]]
            ms = statistics.median(f[2] for f in found) if found else float("nan")
            line += f" | {len(found):>10}/{len(chosen):<5} {precision:>5.2f} {recall:>6.2f} {ms:>7.1f}"
        print(line)
    crop = _face_crop(pose, photo_rgb("obama2.jpg"))
    for name, model in models.items():
        find_ms = statistics.median(_timed(lambda model=model: model.find(crop), 10))
        face = max(model.find(crop), key=lambda f: f.width)
        embed_ms = statistics.median(_timed(lambda model=model, face=face: model.embed(crop, face), 5))
        print(f"{name}: finding the face in a {crop.shape[1]}x{crop.shape[0]} crop {find_ms:.1f} ms, aligning and "
              f"embedding it {embed_ms:.1f} ms")
    _centerface_scores(pose)
    for name in models:
        same = [r[name][3] for r in rows if r["truth"] and r[name][1]]
        other = [r[name][3] for r in rows if not r["truth"] and r[name][1]]
        print(f"{name}: similarity of the enrolled man's faces {min(same, default=float('nan')):.3f}-"
              f"{max(same, default=float('nan')):.3f} (n {len(same)}), strangers' best "
              f"{max(other, default=float('nan')):.3f} (n {len(other)}); threshold {threshold}")
        missed = [f"{r['case']}:{r['photo']}#{r['index']}" for r in rows if r["truth"] and r[name][0] != r["truth"]]
        print(f"  {name} missed: {', '.join(missed) or 'none'}")


SIZES = (30, 40, 50, 60, 80)  # face widths (px) the sizes sweep shrinks each face to


class _BoxWidth(FaceRecognizer):
    """The setting before, kept for the side-by-side: the found face held to min_face_px by CenterFace's box (~15 %
    narrower than the width face_region estimated it at from the pose keypoints)."""

    def found_face_px(self, face: FaceBox) -> float:
        return float(face.width)


def _sizes(pose: object, faces: FaceRecognitionConfig, tmp: Path) -> None:
    """Each face that shows (>= 80 px, facing the camera) shrunk to each of SIZES; Barack enrolled from each of his
    photos in turn and probed with the other two, the strangers once; every variant on the same shrunk photos."""
    variants: dict[str, tuple[type[FaceRecognizer], CenterFaceFaces]] = {
        "box width (before)": (_BoxWidth, CenterFaceFaces(CenterFaceConfig())),
        "landmark width (now)": (FaceRecognizer, CenterFaceFaces(CenterFaceConfig())),
        "min_score 0.3": (FaceRecognizer, CenterFaceFaces(CenterFaceConfig(min_score=0.3))),
    }
    rows: list[dict[str, object]] = []
    for turn, enrolled_from in enumerate(BARACK):
        recognizers = {}
        for name, (kind, model) in variants.items():
            recognizers[name] = kind(model, FaceGallery(tmp / f"sizes-{name}-{turn}"), faces)
            recognizers[name].enrol("Barack", [photo_bytes(enrolled_from)])
            recognizers[name].enrol("Joe", [photo_bytes(ENROLLED["Joe"])])
        for photo, truth in case_probes(enrolled_from, strangers_too=turn == 0).items():
            rows += _shrunk_looks(pose, photo, truth, recognizers)
        for recognizer in recognizers.values():
            recognizer.executor.shutdown()
    print(f"\nsmall faces: {len({(r['photo'], r['index']) for r in rows if r['size'] == SIZES[0]})} faces of 80 px "
          f"or more facing the camera, each shrunk to {', '.join(map(str, SIZES))} px; seen = the pose model still "
          f"finds them facing (nose and eyes); found = a face found, embedded and matched; named = Barack's")
    header = f"{'face px':<8} {'people':>6} {'seen':>5} {'Barack':>6}"
    for name in variants:
        header += f" | {name + ' found':>26} {'prec':>5} {'recall':>6}"
    print(header)
    for size in SIZES:
        chosen = [r for r in rows if r["size"] == size]
        seen = sum(1 for r in chosen if r["seen"])
        line = f"{size:<8} {len(chosen):>6} {seen:>5} {sum(1 for r in chosen if r['truth']):>6}"
        for name in variants:
            precision, recall, *_ = precision_recall([(r["photo"], r["index"], r["truth"], r[name][0])  # type: ignore[index]
                                                      for r in chosen])
            found = sum(1 for r in chosen if r[name][1])  # type: ignore[index]
            line += f" | {found:>20}/{len(chosen):<5} {precision:>5.2f} {recall:>6.2f}"
        print(line)
    for name in variants:
        wrong = [f"{r['size']}px:{r['photo']}#{r['index']}->{r[name][0]}" for r in rows  # type: ignore[index]
                 if r[name][0] is not None and r[name][0] != r["truth"]]  # type: ignore[index]
        missed = [f"{r['size']}px:{r['photo']}#{r['index']}" for r in rows
                  if r["seen"] and not r[name][1]]  # type: ignore[index]
        print(f"  {name}: wrong names {', '.join(wrong) or 'none'}; seen but not found {', '.join(missed) or 'none'}")


def _shrunk_looks(pose: object, photo: str, truth: str | None, recognizers: dict[str, FaceRecognizer],
                  ) -> list[dict[str, object]]:
    """For each person of ``photo`` facing the camera with a face of 80 px or more (the largest first: the one
    ``truth`` names), the photo shrunk to each of SIZES and that person looked at again by every recognizer."""
    original = probe_rgb(photo)
    height, width = original.shape[:2]
    rows: list[dict[str, object]] = []
    for index, person in enumerate(_sorted_people(pose, original)):
        region = face_region(person.box, person.keypoints, width, height, 1)
        if region is None or region[1] < 80:
            continue
        nose = np.array(person.keypoints[0][:2])
        for size in SIZES:
            scale = size / region[1]
            small = cv2.resize(original, (round(width * scale), round(height * scale)), interpolation=cv2.INTER_AREA)
            again = [p for p in _sorted_people(pose, small) if p.keypoints is not None
                     and float(np.abs(np.array(p.keypoints[0][:2]) - nose).max()) < 0.03]
            seen = bool(again) and face_region(again[0].box, again[0].keypoints, small.shape[1], small.shape[0],
                                               1) is not None
            row: dict[str, object] = {"size": size, "photo": photo, "index": index,
                                      "truth": truth if index == 0 else None, "seen": seen}
            for name, recognizer in recognizers.items():
                identity = recognizer.identify(small, again[0].box, again[0].keypoints) if again else None
                row[name] = (identity.name if identity else None, identity is not None)
            rows.append(row)
    return rows


def _centerface_scores(pose: object) -> None:
    """What places CenterFace's min_score: every detection from 0.1 on the whole probe photos (all cases), a face
    when a person's nose keypoint lies inside its box, else not."""
    model = CenterFaceFaces(CenterFaceConfig(min_score=0.1))
    faces, others = [], []
    for photo in (*BARACK, *case_probes("", strangers_too=True)):
        original = probe_rgb(photo)
        for rgb in (original, *(change(original, []) for case, change in CHANGES.items() if case in ("tilted", "dim"))):
            noses = [(d.keypoints[0][0] * rgb.shape[1], d.keypoints[0][1] * rgb.shape[0])
                     for d in pose.detect([np.ascontiguousarray(rgb[..., ::-1])])[0]  # type: ignore[attr-defined]
                     if d.keypoints and d.keypoints[0][2] >= 0.5]
            for box in model.find(rgb):
                on_nose = any(box.left <= x <= box.right and box.top <= y <= box.bottom for x, y in noses)
                (faces if on_nose else others).append(box.score)
    bins = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.01)
    counts = " ".join(f"{low:.1f}-{min(high, 1):.1f}: {sum(low <= v < high for v in faces)}/"
                      f"{sum(low <= v < high for v in others)}" for low, high in itertools.pairwise(bins))
    print(f"centerface scores (faces on a nose / other detections), whole probe photos as taken, tilted, dim: {counts}")


def _face_crop(pose: object, rgb: np.ndarray) -> np.ndarray:
    """The crop a look gives the face model: the largest person's face region, scaled so the face is FACE_PX."""
    person = max((d for d in pose.detect([np.ascontiguousarray(rgb[..., ::-1])])[0]  # type: ignore[attr-defined]
                  if d.label == "person"), key=lambda d: (d.box[2] - d.box[0]) * (d.box[3] - d.box[1]))
    region = face_region(person.box, person.keypoints, rgb.shape[1], rgb.shape[0], 40)
    assert region is not None
    (x1, y1, x2, y2), face_px = region
    scale = FACE_PX / face_px
    return cv2.resize(np.ascontiguousarray(rgb[y1:y2, x1:x2]), None, fx=scale, fy=scale, interpolation=cv2.INTER_AREA)


if __name__ == "__main__":
    main()
