"""Fair share: more cameras with motion than one batch holds are served in turn, none starves."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import av
import numpy as np

from pipelines.video.batcher import InferenceBatcher


class StreamCountingDetectorForTest:
    """Named seam: no model; takes 10 ms a batch (a busy detector) and counts the frames of each stream it sees
    (the stream is written into the image's first pixel)."""

    name = "stream-counting-for-test"
    device = "cpu"

    def __init__(self) -> None:
        self.seen: Counter[int] = Counter()
        self.batches = 0

    def detect(self, images: list[np.ndarray]) -> list[list]:
        time.sleep(0.01)
        self.batches += 1
        for image in images:
            self.seen[int(image[0, 0, 0])] += 1
        return [[] for _ in images]


async def test_more_moving_streams_than_a_batch_holds_are_served_in_turn():
    detector = StreamCountingDetectorForTest()
    batcher = InferenceBatcher(detector, max_batch=2, max_wait_ms=5)  # type: ignore[arg-type]
    streams = 5
    frames = [av.VideoFrame.from_ndarray(np.full((32, 32, 3), index, np.uint8), format="bgr24")
              for index in range(streams)]

    async def camera(index: int) -> None:  # always has a frame with motion waiting: submits again at once
        while detector.batches < 40:
            await batcher.detect(frames[index], stream=index)

    try:
        await asyncio.wait_for(asyncio.gather(*(camera(i) for i in range(streams))), timeout=60)
    finally:
        await batcher.close()
    counts = [detector.seen[i] for i in range(streams)]
    assert min(counts) >= 1 and max(counts) - min(counts) <= 2, counts  # round robin: ~16 each of 80
