"""Issue 32, items 1 and 2, without models: a deleted person's name taken out of the timeline (a real SQLite store
and its writer thread), enrolment photos stored without metadata, and an upload's size read from its header before
anything is decoded. The whole path with the real models: tests/integration/test_faces.py."""

from __future__ import annotations

import io
import json
import struct
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.errors import ApiError
from pipelines.timeline.forget import without_identity, without_name
from pipelines.timeline.store import TimelineEntry, TimelineStore
from pipelines.video.faces import FaceGallery, decode_image, image_header

BARACK = {"name": "Barack", "score": 0.99}


def _entry(kind: str = "event", name: str = "zone.enter", **fields) -> TimelineEntry:
    return TimelineEntry(kind=kind, name=name, source="cam", origin="rtsp", wall_ts=time.time(), **fields)


def _event(track_id: int, identity: dict | None = None, **fields) -> TimelineEntry:
    data = {"zone": "door", "label": "person", "track_id": track_id}
    return _entry(data={**data, "identity": identity} if identity else data, **fields)


def test_a_name_is_taken_out_of_data_at_any_depth_and_out_of_texts_as_a_whole_word():
    data = {"zone": "door", "identity": BARACK, "objects": [{"identity": BARACK}, {"identity": {"name": "Joe"}}]}
    out, changed = without_identity(data, "Barack")
    assert changed and out == {"zone": "door", "objects": [{}, {"identity": {"name": "Joe"}}]}
    assert data["identity"] == BARACK  # the value given is never modified (the live event may still use it)
    assert without_identity({"zone": "Barack"}, "Barack") == ({"zone": "Barack"}, False)  # only identities
    assert without_name("Barack is at the door; Barack's car", "Barack") == ("someone is at the door; someone's car",
                                                                            True)
    assert without_name("Barackson and barack stay", "Barack") == ("Barackson and barack stay", False)
    assert without_name("Will will come", "Will") == ("someone will come", True)
    assert without_name(None, "Barack") == (None, False)


def test_forgetting_a_person_anonymises_every_entry_that_names_them_and_keeps_their_media(tmp_path: Path):
    store = TimelineStore(tmp_path / "timeline", max_age_s=86400, quota_bytes=10**9)
    store.open()
    try:
        entries = [
            _event(1, BARACK, snapshot="snapshots/a.jpg", clip="clips/a.mp4", clip_state="ready"),
            _event(1, BARACK, name="zone.exit", snapshot="snapshots/b.jpg", clip="clips/a.mp4", clip_state="ready"),
            _event(2, {"name": "Joe", "score": 0.95}),
            _event(3, {"name": None, "score": 0.4}),
            _entry("alert", "alert", text="Barack is at the door", data={"event": "zone.enter", "identity": BARACK}),
            _entry("reply", "reply", text="Barack came in at 10:02.", data={"turn": 1}),
            _entry("transcript", "transcript", text="When did Barackson come?", data={"turn": 1}),
        ]
        for entry in entries:
            store.put(entry)
        assert store.flush()
        forgotten = store.forget_identity("Barack", enrolled=True)
        assert (len(forgotten.entries), forgotten.identities, forgotten.texts) == (4, 3, 2)
        assert (forgotten.clips, forgotten.snapshots) == (1, 2)
        assert store.query(identity="Barack", kinds=("event", "alert")) == []
        every = store.query(kinds=("event", "alert", "reply", "transcript"), limit=100)
        assert len(every) == len(entries) and "Barack\"" not in json.dumps([e.as_dict() for e in every])
        by_id = {e.id: e for e in every}
        first = by_id[entries[0].id]
        assert "identity" not in first.data and first.data["label"] == "person"
        assert (first.clip, first.snapshot) == ("clips/a.mp4", "snapshots/a.jpg")  # the footage stays
        assert by_id[entries[2].id].data["identity"]["name"] == "Joe"
        assert by_id[entries[4].id].text == "someone is at the door" and "identity" not in by_id[entries[4].id].data
        assert by_id[entries[5].id].text == "someone came in at 10:02."
        assert by_id[entries[6].id].text == "When did Barackson come?"
        assert b"Barack is at the door" not in (tmp_path / "timeline" / "timeline.db").read_bytes()

        # An event made while he was being deleted (still queued, or from the frame being analysed) loses it too
        late = _event(4, BARACK)
        store.put(late)
        assert store.flush()
        assert "identity" not in store.get(late.id).data
        # Enrolled again: named again from now on
        store.allow_identity("Barack")
        again = _event(5, BARACK)
        store.put(again)
        assert store.flush()
        assert store.get(again.id).data["identity"] == BARACK
    finally:
        store.close()


def test_a_name_nobody_was_recognised_as_changes_no_text(tmp_path: Path):
    store = TimelineStore(tmp_path / "timeline", max_age_s=86400, quota_bytes=10**9)
    store.open()
    try:
        said = _entry("transcript", "transcript", text="I think the door is open", data={"turn": 1})
        store.put(said)
        assert store.flush()
        forgotten = store.forget_identity("I", enrolled=False)  # DELETE /api/faces/I: nobody was ever called that
        assert forgotten.entries == [] and store.get(said.id).text == "I think the door is open"
        late = _event(1, {"name": "I", "score": 0.99})
        store.put(late)
        assert store.flush()
        assert store.get(late.id).data["identity"]["name"] == "I"  # nothing was blocked either
    finally:
        store.close()


# ---------------------------------------------------------------- photos


def _jpeg(width: int, height: int, **save: object) -> bytes:
    out = io.BytesIO()
    rgb = np.random.default_rng(0).integers(0, 255, (height, width, 3), np.uint8)
    Image.fromarray(rgb).save(out, format="JPEG", **save)
    return out.getvalue()


def _with_jpeg_size(jpeg: bytes, width: int, height: int) -> bytes:
    """The same JPEG with its frame header (SOF0) claiming another size: a few KB that say gigapixels."""
    at = jpeg.index(b"\xff\xc0")
    return jpeg[:at + 5] + struct.pack(">HH", height, width) + jpeg[at + 9:]


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG's signature, header (IHDR) and an empty first data chunk: 45 bytes that say any size."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"")


@pytest.mark.parametrize(("data", "size"), [
    (_with_jpeg_size(_jpeg(64, 48), 60000, 60000), "60000x60000"),
    (_png_header_only(30000, 30000), "30000x30000"),
    (_png_header_only(8000, 5001), "8000x5001"),  # just over 40 megapixels
], ids=["jpeg-60000x60000", "png-30000x30000", "png-8000x5001"])
def test_an_image_past_the_pixel_limit_is_refused_from_its_header(data: bytes, size: str):
    with pytest.raises(ApiError) as refused:
        decode_image(data)
    assert refused.value.code == "image_too_large" and size in refused.value.message


def test_the_pixel_limit_is_the_one_given_and_a_photo_under_it_decodes():
    photo = _jpeg(640, 480)
    assert image_header(photo) == (640, 480, "jpg")
    assert decode_image(photo)[0].shape == (480, 640, 3)
    with pytest.raises(ApiError) as refused:
        decode_image(photo, max_pixels=640 * 480 - 1, what="image 2")
    assert refused.value.code == "image_too_large" and refused.value.message.startswith("image 2:")
    for junk in (b"\xff\xd8\xff\xe0 cut short", b"\x89PNG\r\n\x1a\n\x00\x00"):
        with pytest.raises(ApiError) as refused:
            decode_image(junk)
        assert refused.value.code == "invalid_image"


def test_photos_stored_before_with_their_metadata_are_stripped_when_the_gallery_opens(tmp_path: Path):
    exif = Image.Exif()
    exif[315] = "Pete Souza"  # Artist
    exif[0x010F] = "Canon"  # Make
    photo = _jpeg(320, 240, exif=exif.tobytes(), comment=b"taken at home")
    assert b"Pete Souza" in photo
    folder = tmp_path / "faces" / "0123456789abcdef01234567"  # as an older Vigil wrote it: byte for byte
    folder.mkdir(parents=True)
    (folder / "0001.jpg").write_bytes(photo)
    np.save(folder / "embeddings.npy", np.ones((1, 4), np.float32) / 2)
    (folder / "person.json").write_text(json.dumps({"name": "Alice", "images": ["0001.jpg"]}))
    gallery = FaceGallery(tmp_path / "faces")
    assert [p.name for p in gallery.people()] == ["Alice"]
    stored = (folder / "0001.jpg").read_bytes()
    assert b"Pete Souza" not in stored and b"taken at home" not in stored
    with Image.open(io.BytesIO(stored)) as image:
        assert image.size == (320, 240) and not image.getexif() and "comment" not in image.info
    assert json.loads((folder / "person.json").read_text())["stripped"] is True
