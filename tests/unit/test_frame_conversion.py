"""One decoded frame converted by several threads at once (the batcher's BGR copy, a snapshot, a clip, a face
crop) neither crashes nor mixes results up: ``pipelines.video.frames`` gives each thread its own swscale context.

PyAV's own ``frame.to_ndarray(format=...)`` shares one context per frame: the same script with it segfaulted or
hung in 3 runs of 3 here. The threads run in a child process, so a regression fails this test instead of killing
the test run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.support.browser import REPO_ROOT

SCRIPT = textwrap.dedent("""
    import threading

    import av
    import numpy as np

    from pipelines.video.frames import reformat, to_array

    rng = np.random.default_rng(0)
    frame = av.VideoFrame.from_ndarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8), format="bgr24")
    frame = frame.reformat(format="yuv420p")  # as decoded
    formats = ["bgr24", "gray", "rgb24"]
    expected = {name: frame.to_ndarray(format=name) for name in formats}
    small = reformat(frame, width=256, height=192, format="gray").to_ndarray()
    wrong = []

    def work(name):
        for _ in range(300):
            if not np.array_equal(to_array(frame, name), expected[name]):
                wrong.append(name)
            if not np.array_equal(reformat(frame, width=256, height=192, format="gray").to_ndarray(), small):
                wrong.append("small gray")

    threads = [threading.Thread(target=work, args=(name,)) for name in formats * 3]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert to_array(frame, "yuv420p").shape == (720, 640)  # already in that format: no conversion
    print("wrong", len(wrong))
""")


def test_one_frame_converted_by_nine_threads_at_once():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "wrong 0"
