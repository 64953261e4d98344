"""Cross-stream batching: one inference worker per loaded model.

Each stream's analysis task submits its newest sampled frame and waits for the result, so at most one frame
per stream is ever pending; the worker takes what is pending (up to ``max_batch``, waiting at most
``max_wait_ms`` to fill a batch), converts and detects on its own thread in one call, and fans the results out.
While it runs, newer frames replace older ones in the streams' latest-frame slots instead of queueing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import av
import numpy as np

from models.detectors import Detection, Detector
from pipelines import telemetry
from pipelines.video.frames import to_array

T = TypeVar("T")

@dataclass(slots=True)
class BatchResult:
    detections: list[Detection]
    inference_ms: float  # the batch's model time
    batch_size: int


@dataclass(slots=True)
class _Request:
    image: np.ndarray
    future: asyncio.Future[BatchResult]


class FrameDetector(Protocol):
    """What a stream's analyser needs of detection: the in-process ``InferenceBatcher``, or
    ``pipelines.video.workers.DetectorWorkers`` (the same batching in child processes); the analyser cannot tell."""

    name: str

    @property
    def detector(self) -> object:
        """The loaded detector, or the worker's description of it (its ``names`` and ``classes``)."""
        ...

    async def detect(self, frame: av.VideoFrame, stream: int = 0) -> BatchResult: ...

    async def offload(self, work: Callable[..., T], *args: Any) -> T: ...

    @property
    def has_headroom(self) -> bool: ...

    async def close(self) -> None: ...


def lower_thread_priority(nice: int) -> None:
    """Executor initializer: this thread (and the threads it starts, such as the model's own thread pool) runs
    ``nice`` steps below the process (Linux schedules threads individually; raising niceness needs no privilege)."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    with contextlib.suppress(OSError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + nice))


def to_bgr(frame: av.VideoFrame) -> np.ndarray:
    """Only sampled frames pay for this conversion (decoding every frame is unavoidable, converting is not)."""
    return to_array(frame, "bgr24")


class InferenceBatcher:
    ACTIVE_WINDOW_S = 2.0  # a stream that submitted this recently is expected to submit again
    BUSY_WINDOW_S = 2.0  # how far back ``busy`` looks
    BOOST_MAX_BUSY = 0.5  # a stream may sample faster than its target only while the model is busy less than this

    def __init__(self, detector: Detector, *, max_batch: int = 8, max_wait_ms: float = 10.0,
                 nice: int = 0, on_batch: Callable[[int, float], None] | None = None) -> None:
        """``on_batch(size, ms)``: told of every batch (a worker process reports them to the server)."""
        self.detector = detector
        self.name = detector.name
        self._on_batch = on_batch
        self._last_submit: dict[int, float] = {}
        self.max_batch = max_batch
        self.max_wait_s = max_wait_ms / 1000.0
        self._pending: list[_Request] = []
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        # One thread per model: detectors are not thread-safe, and a second thread would only contend.
        # ``nice``: on a shared CPU the voice loop (latency) goes before video analysis (throughput; a frame that
        # waits is replaced by a newer one, counted as dropped).
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"infer-{detector.name}",
                                            initializer=lower_thread_priority, initargs=(nice,))
        # Conversion runs beside inference (not in series with it): the next batch is ready when the model is.
        self._convert = ThreadPoolExecutor(max_workers=2, thread_name_prefix="convert",
                                           initializer=lower_thread_priority, initargs=(nice,))
        self._metrics = telemetry.InferenceMetrics(detector.name)
        self._batches: deque[tuple[float, float]] = deque()  # (loop time it ended, seconds it took), recent

    async def detect(self, frame: av.VideoFrame, stream: int = 0) -> BatchResult:
        """``stream`` identifies the caller, so the batcher knows how many frames a batch can expect."""
        image = await asyncio.get_running_loop().run_in_executor(self._convert, to_bgr, frame)
        return await self.detect_image(image, stream)

    async def detect_image(self, image: np.ndarray, stream: int = 0) -> BatchResult:
        """``detect`` for a frame already converted to BGR (a worker process reads it from shared memory)."""
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            self._wakeup = asyncio.Event()
            self._task = asyncio.create_task(self._run(), name=f"batcher:{self.detector.name}")
        self._last_submit[stream] = loop.time()
        future: asyncio.Future[BatchResult] = loop.create_future()
        self._pending.append(_Request(image, future))
        assert self._wakeup is not None
        self._wakeup.set()
        return await future

    @property
    def busy(self) -> float:
        """Share of the last ``BUSY_WINDOW_S`` the model spent detecting (0..1)."""
        if not self._batches:
            return 0.0
        since = time.monotonic() - self.BUSY_WINDOW_S
        while self._batches and self._batches[0][0] < since:
            self._batches.popleft()
        return min(1.0, sum(seconds for _, seconds in self._batches) / self.BUSY_WINDOW_S)

    @property
    def has_headroom(self) -> bool:
        """Whether a stream may ask for more frames than its target (motion boost) without taking the detector's
        time from the node's other streams."""
        return self.busy < self.BOOST_MAX_BUSY

    async def offload(self, work: Callable[..., T], *args: Any) -> T:
        """Run light per-frame work (a stream's motion check) on the conversion threads: never on the event loop,
        which reads every session's media."""
        return await asyncio.get_running_loop().run_in_executor(self._convert, work, *args)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for request in self._pending:
            request.future.cancel()
        self._pending.clear()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._convert.shutdown(wait=False, cancel_futures=True)

    def _expected(self, now: float) -> int:
        """How many frames are worth waiting for: one per recently active stream, at most max_batch."""
        for stream, last in list(self._last_submit.items()):
            if now - last > self.ACTIVE_WINDOW_S:
                del self._last_submit[stream]
        return max(1, min(self.max_batch, len(self._last_submit)))

    async def _run(self) -> None:
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            if not self._pending:
                continue
            deadline = loop.time() + self.max_wait_s
            # Wait only for streams that can still submit: each stream has at most one frame pending.
            while len(self._pending) < self._expected(loop.time()) and (left := deadline - loop.time()) > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wakeup.wait(), left)
                self._wakeup.clear()
            batch = [r for r in self._pending[: self.max_batch] if not r.future.done()]
            del self._pending[: self.max_batch]
            if self._pending:
                self._wakeup.set()  # more waiting: go round again at once
            if not batch:
                continue
            started = time.perf_counter()
            try:
                results = await loop.run_in_executor(self._executor, self.detector.detect, [r.image for r in batch])
            except Exception as error:
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(error)
                continue
            elapsed_ms = (time.perf_counter() - started) * 1000.0
            self._metrics.observe(len(batch), elapsed_ms)
            self._batches.append((time.monotonic(), elapsed_ms / 1000.0))
            if self._on_batch is not None:
                self._on_batch(len(batch), elapsed_ms)
            for request, detections in zip(batch, results, strict=True):
                if not request.future.done():
                    request.future.set_result(BatchResult(detections, elapsed_ms, len(batch)))
