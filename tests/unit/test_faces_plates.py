"""Issue 22's logic without models: where a face is looked for, how often, what a track keeps, how names and
plates reach events, alerts, memory, the scene text and the config. The models themselves are tested on real
photos in tests/integration/test_faces.py."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest

from models.detectors import Detection
from models.plates import TextLine
from pipelines.memory.feed import describe_event
from pipelines.protocol import EVENT_PAYLOADS, DetectedObject, ZoneConfig
from pipelines.scene import SceneState, known_in_view
from pipelines.timeline.alerts import render, spoken_names
from pipelines.timeline.store import TimelineEntry, TimelineStore
from pipelines.video.faces import FaceGallery, FaceRecognitionConfig, Identity, StreamFaces, check_name, face_region
from pipelines.video.plates import PlateReader, PlateReadingConfig, normalise_plate
from pipelines.voice.replies import session_prompt, turn_messages
from server.config import load_settings
from server.config.faces import FacesSection, PlatesSection

# COCO keypoints 0-4 (nose, eyes, ears) of a person facing the camera in a 640x480 frame, normalised
FRONT = [(0.50, 0.20, 0.9), (0.52, 0.18, 0.9), (0.48, 0.18, 0.9), (0.55, 0.19, 0.8), (0.45, 0.19, 0.8)]
BOX = (0.4, 0.1, 0.6, 0.9)


def test_a_face_is_looked_for_around_the_nose_and_eyes_of_a_person_facing_the_camera():
    region = face_region(BOX, FRONT, 640, 480, min_face_px=16)
    assert region is not None
    (x1, y1, x2, y2), face_px = region
    assert x1 < 0.48 * 640 < 0.52 * 640 < x2 and y1 < 0.18 * 480 < 0.20 * 480 < y2
    assert face_px == pytest.approx(2.5 * 0.04 * 640)  # 2.5 x the eyes (more than 0.9 x ear to ear here)


def test_a_person_seen_from_the_side_or_behind_or_too_far_is_not_looked_at():
    profile = [FRONT[0], FRONT[1], (0.48, 0.18, 0.1), FRONT[3], (0.45, 0.19, 0.05)]  # one eye hidden
    assert face_region(BOX, profile, 640, 480, min_face_px=16) is None
    assert face_region(BOX, [(x, y, 0.0) for x, y, _ in FRONT], 640, 480, min_face_px=16) is None  # from behind
    assert face_region(BOX, FRONT, 640, 480, min_face_px=100) is None  # a 64 px face
    # No pose (an SSD detector): the top of the box
    (x1, y1, x2, _), _ = face_region(BOX, None, 640, 480, min_face_px=16)
    assert (x1, x2) == (256, 384) and y1 == 48


@pytest.mark.parametrize("name", ["Alice", "Bob Smith", "Zoë", "o'Brien-2", "李"])
def test_names_people_have_are_accepted(name: str):
    assert check_name(name) == name


@pytest.mark.parametrize("name", ["", " Alice", "Alice ", "../x", "a/b", "-x", "x" * 65, "a\nb"])
def test_names_that_could_be_paths_or_junk_are_refused(name: str):
    with pytest.raises(Exception) as raised:
        check_name(name)
    assert getattr(raised.value, "code", None) == "invalid_name"


def _unit(seed: int) -> np.ndarray:
    vector = np.random.default_rng(seed).normal(size=128).astype(np.float32)
    return vector / np.linalg.norm(vector)


def test_the_gallery_matches_by_cosine_persists_and_deletes_everything(tmp_path: Path):
    gallery = FaceGallery(tmp_path / "faces")
    assert gallery.match(_unit(1)) == (None, -1.0)
    gallery.add("Alice", np.stack([_unit(1)]), [(b"\xff\xd8\xffjpeg", "jpg")])
    gallery.add("Bob", np.stack([_unit(2), _unit(3)]), [(b"a", "png"), (b"b", "png")])
    name, score = gallery.match(_unit(3))
    assert name == "Bob" and score == pytest.approx(1.0, abs=1e-5)
    again = FaceGallery(tmp_path / "faces")  # a restart reads it back
    assert {p.name: len(p.embeddings) for p in again.people()} == {"Alice": 1, "Bob": 2}
    folder = next(f for f in (tmp_path / "faces").iterdir() if "Alice" in (f / "person.json").read_text())
    assert (folder / "0001.jpg").read_bytes() == b"\xff\xd8\xffjpeg"
    version = again.version
    assert again.delete("Alice") and not again.delete("Alice")
    assert again.version > version and not folder.exists()
    assert again.match(_unit(1))[0] == "Bob"  # the nearest is now someone else: the threshold decides
    assert [p.name for p in FaceGallery(tmp_path / "faces").people()] == ["Bob"]


class ScriptedRecognizerForTest:
    """The seam of ``StreamFaces``: scripted identities per track id instead of the dlib model, counting calls."""

    def __init__(self, gallery: FaceGallery, settings: FaceRecognitionConfig) -> None:
        self.gallery, self.settings = gallery, settings
        self.executor = ThreadPoolExecutor(1)
        self.script: dict[int, list[Identity | None]] = {}
        self.calls: list[int] = []

    def identify(self, image: np.ndarray, box: Any, keypoints: Any) -> Identity | None:
        track_id = round(box[0] * 100)  # the tests put the track id in the box
        self.calls.append(track_id)
        answers = self.script.get(track_id) or [None]
        return answers.pop(0) if len(answers) > 1 else answers[0]


def _person(track_id: int, width: float = 0.1) -> Detection:
    return Detection("person", 0, 0.9, (track_id / 100, 0.1, track_id / 100 + width, 0.9), FRONT, track_id)


async def test_each_track_is_looked_at_once_per_interval_keeps_its_name_and_loses_a_deleted_one(tmp_path: Path):
    gallery = FaceGallery(tmp_path / "faces")
    gallery.add("Alice", np.stack([_unit(1)]), [])
    settings = FaceRecognitionConfig(enabled=True, interval_s=1.0, max_per_frame=2)
    recognizer = ScriptedRecognizerForTest(gallery, settings)
    recognizer.script = {1: [Identity(None, 0.3), Identity("Alice", 0.95), Identity(None, 0.2)],
                         2: [None], 3: [Identity(None, 0.1)]}
    faces = StreamFaces(recognizer)  # type: ignore[arg-type]
    frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")

    async def step(pts: float, tracks: list[int]) -> tuple[list[dict], list[tuple[str, dict]]]:
        detections = [_person(t, width=0.05 * t) for t in tracks]
        objects = [d.as_message() for d in detections]
        events = [("zone.enter", {"zone": "door", "track_id": t, "label": "person"}) for t in tracks]
        await faces.annotate(frame, pts, detections, objects, events)
        return objects, events

    objects, _ = await step(0.0, [1, 2, 3])
    assert sorted(recognizer.calls) == [2, 3]  # max_per_frame, largest first: track 1 waits
    assert "identity" not in objects[1] and objects[2]["identity"] == {"name": None, "score": 0.1}
    await step(0.2, [1, 2, 3])
    assert recognizer.calls[-1] == 1 and len(recognizer.calls) == 3  # 2 and 3 are not due before 1.0 s
    objects, events = await step(1.2, [1, 3])  # both due again: 3 (larger) and 1
    assert recognizer.calls[3:] == [3, 1]
    assert objects[0]["identity"] == {"name": "Alice", "score": 0.95} and objects[1]["identity"]["name"] is None
    assert events[0][1]["identity"]["name"] == "Alice"
    await step(1.3, [1, 3])
    objects, _ = await step(4.0, [1])  # known: never looked at again (a worse view cannot undo it)
    assert len(recognizer.calls) == 5 and objects[0]["identity"]["name"] == "Alice"
    gallery.delete("Alice")
    objects, _ = await step(4.1, [1])  # deleted: the name is taken back at once and the face looked at again
    assert len(recognizer.calls) == 6 and objects[0]["identity"] == {"name": None, "score": 0.2}
    recognizer.executor.shutdown()


async def test_an_unknown_face_is_looked_at_less_and_less_often(tmp_path: Path):
    settings = FaceRecognitionConfig(enabled=True, interval_s=1.0)
    recognizer = ScriptedRecognizerForTest(FaceGallery(tmp_path / "faces"), settings)
    recognizer.script = {1: [Identity(None, 0.4)]}
    faces = StreamFaces(recognizer)  # type: ignore[arg-type]
    frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
    looked = []
    for step in range(40):  # 20 s at 2 frames/s
        calls = len(recognizer.calls)
        await faces.annotate(frame, step / 2, [_person(1)], [], [])
        if len(recognizer.calls) > calls:
            looked.append(step / 2)
    assert looked == [0.0, 1.0, 3.0, 7.0, 15.0]  # 1, 2, 4, 8 s apart (at most 8 x interval_s)
    recognizer.executor.shutdown()


class SlowRecognizerForTest(ScriptedRecognizerForTest):
    """A look that takes ``seconds`` (a loaded CPU)."""

    seconds = 0.3

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.finished = 0  # looks done (the test waits for them: a loaded CI machine is slower than any sleep)

    def identify(self, image: np.ndarray, box: Any, keypoints: Any) -> Identity | None:
        time.sleep(self.seconds)
        try:
            return super().identify(image, box, keypoints)
        finally:
            self.finished += 1

    async def wait_finished(self, looks: int) -> None:
        for _ in range(1000):
            if self.finished >= looks:
                await asyncio.sleep(0.05)  # its result reaches the event loop
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{self.finished} of {looks} looks finished in 10 s")


async def test_a_slow_look_never_holds_a_frame_longer_than_max_wait_and_lands_on_a_later_frame(tmp_path: Path):
    gallery = FaceGallery(tmp_path / "faces")
    recognizer = SlowRecognizerForTest(gallery, FaceRecognitionConfig(enabled=True, max_wait_s=0.05, max_per_frame=1))
    recognizer.script = {1: [Identity("Alice", 0.95)], 2: [Identity("Bob", 0.95)]}
    faces = StreamFaces(recognizer)  # type: ignore[arg-type]
    frame = av.VideoFrame.from_ndarray(np.zeros((48, 64, 3), np.uint8), format="rgb24")
    objects = [_person(1).as_message(), _person(2).as_message()]
    started = time.perf_counter()
    await faces.annotate(frame, 0.0, [_person(1), _person(2, 0.05)], objects, [])
    assert time.perf_counter() - started < 0.25 and "identity" not in objects[0]
    await faces.annotate(frame, 0.1, [_person(1), _person(2, 0.05)], [], [])  # one look in flight: none started
    await recognizer.wait_finished(1)
    objects = [_person(1).as_message(), _person(2).as_message()]
    await faces.annotate(frame, 0.2, [_person(1), _person(2, 0.05)], objects, [])  # the first look landed; next
    assert objects[0]["identity"]["name"] == "Alice" and "identity" not in objects[1]  # track 2's is under way
    await recognizer.wait_finished(2)
    objects = [_person(1).as_message(), _person(2).as_message()]
    await faces.annotate(frame, 0.3, [_person(1), _person(2, 0.05)], objects, [])
    assert objects[1]["identity"]["name"] == "Bob" and recognizer.calls == [1, 2]
    recognizer.executor.shutdown()


def test_plates_are_read_from_plate_like_lines_best_first_and_named_when_known():
    reader = PlateReader(object(), PlateReadingConfig(known={"ab 12-cde": "Alice's car"}, min_score=0.6))  # type: ignore[arg-type]
    lines = [TextLine("TOYOTA", 0.99, (0, 0, 1, 1)), TextLine("AB12 CDE", 0.91, (0, 0, 1, 1)),
             TextLine("AB12CDF", 0.85, (0, 0, 1, 1)), TextLine("X9Y8Z7", 0.5, (0, 0, 1, 1))]
    best = reader.best(lines)
    assert best is not None and (best.text, best.name) == ("AB12CDE", "Alice's car")
    assert reader.best(lines[:1]) is None  # a word without a digit is not a plate
    assert reader.best([lines[3]]) is None  # too unsure
    assert normalise_plate("ab-12 cd") == "AB12CD"


def test_names_and_plates_reach_alerts_memory_and_the_scene_text():
    data = {"zone": "door", "track_id": 3, "label": "person", "identity": {"name": "Alice", "score": 0.97}}
    assert render("{identity} is at the {zone}", {**data, **spoken_names(data)}) == "Alice is at the door"
    unknown = {**data, "identity": {"name": None, "score": 0.4}}
    assert render("{identity} is at the {zone}", {**unknown, **spoken_names(unknown)}) == "someone is at the door"
    assert describe_event("zone.enter", data).startswith("Alice, a person (track 3), entered zone 'door'")
    car = {"line": "gate", "track_id": 5, "label": "car", "direction": "in",
           "plate": {"text": "AB12CDE", "score": 0.9, "name": "Alice's car"}}
    assert "plate AB12CDE (Alice's car)" in describe_event("line.cross", car)
    objects = [{"label": "person", "identity": {"name": "Alice", "score": 0.97}},
               {"label": "person", "identity": {"name": None, "score": 0.2}}, {"label": "car", "plate": car["plate"]}]
    scene = SceneState()
    scene.update(labels=["person", "person", "car"], pts=1.0, ts=1.0, model="m", zone_occupancy={}, line_counts={},
                 events=[], known=known_in_view(objects))
    assert "Recognised in view: Alice (person), a car with plate AB12CDE (Alice's car)." in scene.summary()
    assert ZoneConfig(name="door", polygon=[(0, 0), (1, 0), (1, 1)], announce="{identity} at the {plate}")


def test_identity_and_plate_are_part_of_the_protocol():
    for name in ("zone.enter", "zone.exit", "line.cross", "object.appeared"):
        fields = EVENT_PAYLOADS[name].model_fields
        assert "identity" in fields and "plate" in fields
    DetectedObject.model_validate({"label": "person", "class_id": 0, "conf": 0.9, "box": (0, 0, 1, 1),
                                   "identity": {"name": "Alice", "score": 0.9}})


def test_faces_and_plates_are_off_by_default_and_on_with_one_key():
    settings = load_settings(None, {})
    assert not settings.video.faces.enabled and not settings.video.plates.enabled
    on = load_settings(None, {"video": {"faces": {"enabled": True}, "plates": {"enabled": True}}})
    assert on.video.faces.enabled and on.video.plates.enabled
    assert on.video.faces.model.backend == "centerface" and on.video.plates.model.backend == "rapidocr"
    hog = load_settings(None, {"video": {"faces": {"model": {"backend": "dlib"}}}})
    assert hog.video.faces.model.backend == "dlib"  # HOG stays selectable


def _changed(value: Any) -> Any:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value / 2 if isinstance(value, float) else value + 1
    if isinstance(value, list):
        return [*value, "extra"]
    if isinstance(value, dict):
        return {**value, "XY12": "extra"}
    return value


@pytest.mark.parametrize(("key", "section", "pipeline_config"), [
    ("faces", FacesSection, FaceRecognitionConfig),
    ("plates", PlatesSection, PlateReadingConfig),
])
def test_a_video_section_is_its_pipelines_config_plus_its_model(key, section, pipeline_config):
    assert issubclass(section, pipeline_config)  # the server hands its section to the pipeline as it is
    assert set(section.model_fields) - set(pipeline_config.model_fields) == {"model"}
    defaults = pipeline_config()
    values = {name: _changed(getattr(defaults, name)) for name in pipeline_config.model_fields}
    configured = getattr(load_settings(None, {"video": {key: values}}).video, key)
    assert isinstance(configured, pipeline_config)
    assert {name: getattr(configured, name) for name in values} == values


def test_the_timeline_finds_events_by_identity_and_by_plate(tmp_path: Path):
    store = TimelineStore(tmp_path / "timeline", max_age_s=86400, quota_bytes=10**9)
    store.open()
    try:
        people = [{"name": "Alice", "score": 0.95}, {"name": None, "score": 0.3}, None]
        for index, identity in enumerate(people):
            data = {"zone": "door", "track_id": index + 1, "label": "person"}
            store.put(TimelineEntry(kind="event", name="zone.enter", source="cam", origin="rtsp", wall_ts=time.time(),
                                    data={**data, "identity": identity} if identity else data))
        store.put(TimelineEntry(kind="event", name="line.cross", source="cam", origin="rtsp", wall_ts=time.time(),
                                data={"line": "gate", "track_id": 9, "label": "car", "direction": "in",
                                      "plate": {"text": "AB12CDE", "score": 0.9, "name": None}}))
        assert store.flush()
        assert [e.data["track_id"] for e in store.query(identity="Alice")] == [1]
        assert store.query(identity="Bob") == []
        assert [e.data["track_id"] for e in store.query(plate="AB12CDE")] == [9]
        assert len(store.query()) == 4
    finally:
        store.close()


def test_who_is_at_the_door_is_answered_from_a_prompt_that_names_them():
    scene = SceneState()
    scene.update(labels=["person"], pts=1.0, ts=1.0, model="m", zone_occupancy={}, line_counts={}, events=[],
                 known=known_in_view([{"label": "person", "identity": {"name": "Alice", "score": 0.97}}]))
    system = session_prompt("You are Vigil.", video=True)
    question = turn_messages(system, [], "Who is at the door?", video=True, scene=scene.summary())[-1].content
    assert "Recognised in view: Alice (person)." in question
