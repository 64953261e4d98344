"""video.inference_nice: the detector's threads, and the threads they start (the model's own pool), run below the
process, so that on a shared CPU the voice loop keeps its latency."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from pipelines.video.batcher import lower_thread_priority

pytestmark = pytest.mark.skipif(not hasattr(os, "setpriority"), reason="per-thread niceness is Linux's")


def _niceness() -> int:
    return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def _niceness_of_a_thread_started_here() -> int:
    seen: list[int] = []
    child = threading.Thread(target=lambda: seen.append(_niceness()))
    child.start()
    child.join()
    return seen[0]


def test_the_inference_thread_and_the_threads_it_starts_run_below_the_process():
    process = _niceness()
    expected = min(19, process + 5)
    with ThreadPoolExecutor(1, initializer=lower_thread_priority, initargs=(5,)) as executor:
        assert executor.submit(_niceness).result() == expected
        assert executor.submit(_niceness_of_a_thread_started_here).result() == expected
    assert _niceness() == process  # the event loop's thread is untouched


def test_zero_leaves_the_thread_alone():
    process = _niceness()
    with ThreadPoolExecutor(1, initializer=lower_thread_priority, initargs=(0,)) as executor:
        assert executor.submit(_niceness).result() == process
