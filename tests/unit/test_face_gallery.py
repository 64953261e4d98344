"""The face gallery's bookkeeping (no model): negatives ("not this person") and removing one photo."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.errors import ApiError
from pipelines.video.faces import FaceGallery


def _unit(*values: float) -> np.ndarray:
    vector = np.array(values, np.float32)
    return vector / np.linalg.norm(vector)


def test_a_face_nearer_a_negative_than_the_persons_photos_is_not_named(tmp_path: Path):
    gallery = FaceGallery(tmp_path)
    gallery.add("Alice", _unit(1, 0, 0)[None, :], [(b"photo", "jpg")])
    stranger = _unit(0.9, 0.3, 0)
    assert gallery.match(stranger)[0] == "Alice"
    gallery.add_negative("Alice", stranger)
    name, score = gallery.match(_unit(0.9, 0.32, 0))  # nearer her negative than her photo
    assert name is None and score > 0.9
    assert gallery.match(_unit(1, 0.05, 0))[0] == "Alice"  # she is still named
    again = FaceGallery(tmp_path)  # the negative is on disk, with her
    assert again.person("Alice").negative_count() == 1 and again.match(_unit(0.9, 0.32, 0))[0] is None
    assert again.add_negative("Bob", stranger) is None
    again.delete("Alice")
    assert list(tmp_path.iterdir()) == []  # nothing of her left, negatives included


def test_removing_a_photo_drops_its_embedding_and_a_new_photo_never_reuses_its_number(tmp_path: Path):
    gallery = FaceGallery(tmp_path)
    gallery.add("Alice", np.stack([_unit(1, 0, 0), _unit(0, 1, 0)]), [(b"one", "jpg"), (b"two", "png")])
    kept = gallery.remove_photo("Alice", "0001")
    assert kept is not None and kept.images == ["0002.png"] and len(kept.embeddings) == 1
    assert gallery.match(_unit(1, 0, 0))[1] < 0.1  # the removed photo's face no longer matches
    gallery.add("Alice", _unit(0, 0, 1)[None, :], [(b"three", "jpg")])
    person = FaceGallery(tmp_path).person("Alice")
    assert person.images == ["0002.png", "0003.jpg"]
    assert gallery.photo_path("Alice", "0003").read_bytes() == b"three"
    assert gallery.photo_path("Alice", "0001") is None and gallery.remove_photo("Alice", "0001") is None
    gallery.remove_photo("Alice", "0002")
    with pytest.raises(ApiError) as refused:
        gallery.remove_photo("Alice", "0003")  # the last one: delete the person instead
    assert refused.value.code == "conflict"
