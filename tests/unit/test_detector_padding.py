"""Detector workers on a GPU run every batch at one of a few fixed sizes (``PaddedDetector``): the padding repeats
the last image (same shape: the letterbox does not change) and its results are dropped."""

from __future__ import annotations

import numpy as np

from models.detectors import Detection
from pipelines.video.detector_worker import PaddedDetector, fixed_batch_sizes


class RecordingDetectorForTest:
    """A stand-in at the detector seam: one detection per image, labelled with the image's first pixel."""

    name, device = "recording", "cuda:0"

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.names = {0: "person"}

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        self.batch_sizes.append(len(images))
        return [[Detection(str(int(image[0, 0, 0])), 0, 1.0, (0, 0, 1, 1))] for image in images]


def test_fixed_sizes_are_powers_of_two_and_the_largest_batch():
    assert fixed_batch_sizes(1) == (1,)
    assert fixed_batch_sizes(8) == (1, 2, 4, 8)
    assert fixed_batch_sizes(12) == (1, 2, 4, 8, 12)


def test_batches_are_padded_to_a_fixed_size_and_the_padding_dropped():
    inner = RecordingDetectorForTest()
    padded = PaddedDetector(inner, max_batch=8)  # type: ignore[arg-type]
    for count in (1, 3, 5, 8):
        images = [np.full((4, 6, 3), k, np.uint8) for k in range(count)]
        results = padded.detect(images)
        assert [r[0].label for r in results] == [str(k) for k in range(count)]  # each image its own answer
    assert inner.batch_sizes == [1, 4, 8, 8]
    assert padded.names == {0: "person"}  # what the label checks read passes through
