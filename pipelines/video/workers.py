"""Detection in worker processes (``video.detector_workers`` >= 1): the server's side.

Why: in one process, decoding, motion checks, tracking, the event loop and the inference thread's kernel launches
all take turns on one GIL; on a GPU the pipeline got 0.30 of the raw batched model. Each worker process
(``pipelines.video.detector_worker``, spawned) loads the configured detector itself and batches across the streams
it serves, as the in-process ``InferenceBatcher`` does (it runs one).

Frames cross in shared memory: each stream has one block of ``SLOTS_PER_STREAM`` slots, each one BGR frame
(``multiprocessing.shared_memory``, named ``vigil-det-<server pid>-<n>``; a new block when the frame size changes).
The server converts a sampled frame into a free slot on its conversion threads and sends the worker the slot's
name, offset and shape over a pipe; the detections come back on the same pipe. A slot is busy from the moment it is
written until its answer arrives (or its worker is lost and killed), so a slot being read is never overwritten;
which frame is sent stays the session's latest-frame slot's choice, as in process (a newer frame replaces one not
yet taken, the drop counted). Streams are pinned to a worker (the least loaded when first seen).

Isolation: a worker that exits, is killed, or hangs (no heartbeat, or a frame unanswered, within
``answer_timeout_s``) is killed and started again. Its frames in flight fail with ``DetectorOutage`` (code
``detector_unavailable``: the session says so once per outage, counts ``frames_failed`` and goes on), as do frames
sent while it restarts; ``vigil_detector_outages_total`` and ``vigil_detector_outage_frames_total`` count them.
Blocks are unlinked on close, when a stream's frame size changes, and when a stream has been idle for
``IDLE_BLOCK_S``; were the server killed, multiprocessing's resource tracker unlinks what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.shared_memory import SharedMemory
from typing import Any, TypeVar

import av
import numpy as np

from models.detectors import Detection
from models.registry import BackendConfig
from pipelines import telemetry
from pipelines.video.batcher import BatchResult, lower_thread_priority, to_bgr
from pipelines.video.detector_worker import serve

log = logging.getLogger(__name__)

T = TypeVar("T")

SLOTS_PER_STREAM = 2  # one being read by the worker, one for the next frame of a stream that gave up waiting
SHM_PREFIX = "vigil-det-"
IDLE_BLOCK_S = 30.0  # a stream that sent nothing this long has ended (analysers are not told): free its block
HEARTBEAT_S = 0.5
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0)  # after failed starts in a row (a broken model keeps failing)
_block_ids = itertools.count()  # per process, not per pool: two pools in one process never share a block name


class DetectorOutage(RuntimeError):
    """The frame's detector worker was lost or is restarting: a transient, per-frame condition, not a bad frame."""

    code = "detector_unavailable"


@dataclass(slots=True)
class DetectorInfo:
    """The loaded detector as the worker described it: what the plates' label check reads."""

    name: str
    device: str
    names: dict[int, str] | None = None
    classes: list[int] | None = None


@dataclass(slots=True)
class _StreamBlock:
    memory: SharedMemory
    shape: tuple[int, int, int]
    busy: list[bool]
    worker: int
    last_used: float

    @property
    def slot_bytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.shape[2]


@dataclass(slots=True)
class _InFlight:
    future: asyncio.Future[BatchResult]
    stream: int
    slot: int
    sent_at: float


@dataclass
class _Worker:
    index: int
    process: BaseProcess | None = None
    conn: Connection | None = None
    ready: bool = False
    started_at: float = 0.0
    last_heard: float = 0.0
    failed_starts: int = 0
    start_error: str | None = None
    inflight: dict[int, _InFlight] = field(default_factory=dict)
    send_lock: threading.Lock = field(default_factory=threading.Lock)
    ready_event: threading.Event = field(default_factory=threading.Event)


class DetectorWorkers:
    """A ``FrameDetector`` (``pipelines.video.batcher``) whose detections come from ``workers`` child processes.
    ``start`` blocks until every worker has loaded its model (call it from a thread, as loading a detector)."""

    BUSY_WINDOW_S = 2.0
    BOOST_MAX_BUSY = 0.5

    def __init__(self, config: BackendConfig, *, workers: int, max_batch: int = 8, max_wait_ms: float = 10.0,
                 nice: int = 0, answer_timeout_s: float = 10.0, start_timeout_s: float = 300.0) -> None:
        if workers < 1:
            raise ValueError("DetectorWorkers needs at least one worker (0 means detection in process)")
        self.config = config
        self.max_batch, self.max_wait_ms, self.nice = max_batch, max_wait_ms, nice
        self.answer_timeout_s, self.start_timeout_s = answer_timeout_s, start_timeout_s
        self.name = "detector"
        self.detector = DetectorInfo("detector", "?")
        self._context = multiprocessing.get_context("spawn")  # never fork a process full of threads
        self._workers = [_Worker(i) for i in range(workers)]
        self._streams: dict[int, _StreamBlock] = {}
        self._lock = threading.Lock()  # workers' state, streams' blocks: loop, conversion, reader, monitor threads
        self._request_ids = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = threading.Event()
        self._monitor: threading.Thread | None = None
        self._convert = ThreadPoolExecutor(max_workers=2, thread_name_prefix="convert",
                                           initializer=lower_thread_priority, initargs=(nice,))
        self._metrics: telemetry.InferenceMetrics | None = None
        self._batches: deque[tuple[float, float]] = deque()  # (monotonic end, seconds), all workers

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        for worker in self._workers:
            self._spawn(worker)
        deadline = time.monotonic() + self.start_timeout_s
        for worker in self._workers:
            while not worker.ready_event.wait(0.2):
                if worker.start_error is not None or time.monotonic() > deadline or not self._alive(worker):
                    reason = worker.start_error or "it exited or did not load its model in time"
                    self._stop_all()
                    raise RuntimeError(f"detector worker {worker.index} did not start: {reason}")
        self._monitor = threading.Thread(target=self._watch, name="detector-workers", daemon=True)
        self._monitor.start()
        log.info("detector %s on %s in %d worker process(es): pids %s", self.name, self.detector.device,
                 len(self._workers), self.pids)

    @property
    def pids(self) -> list[int | None]:
        return [w.process.pid if w.process is not None and w.ready else None for w in self._workers]

    async def close(self) -> None:
        self._closed.set()
        if self._monitor is not None:
            await asyncio.to_thread(self._monitor.join, 5.0)
        await asyncio.to_thread(self._stop_all)
        self._convert.shutdown(wait=False, cancel_futures=True)

    def _stop_all(self) -> None:
        self._closed.set()
        for worker in self._workers:
            with contextlib.suppress(OSError, ValueError), worker.send_lock:
                if worker.conn is not None:
                    worker.conn.send(("stop",))
        for worker in self._workers:
            if worker.process is not None:
                worker.process.join(2.0)
            self._kill(worker)
            self._fail_inflight(worker, "the detector is shutting down", count=False)
        with self._lock:
            blocks, self._streams = list(self._streams.values()), {}
        for block in blocks:
            _unlink(block.memory)
        for worker in self._workers:
            telemetry.DETECTOR_WORKER_PID.labels(worker=str(worker.index)).set(0)

    # ------------------------------------------------------------------ the FrameDetector side

    async def detect(self, frame: av.VideoFrame, stream: int = 0) -> BatchResult:
        loop = asyncio.get_running_loop()
        self._loop = loop
        future: asyncio.Future[BatchResult] = loop.create_future()
        await loop.run_in_executor(self._convert, self._submit, frame, stream, future)
        return await future

    async def offload(self, work: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._convert, work, *args)

    @property
    def busy(self) -> float:
        """Share of the last ``BUSY_WINDOW_S`` the workers spent detecting (0..1, averaged over workers)."""
        since = time.monotonic() - self.BUSY_WINDOW_S
        with self._lock:
            while self._batches and self._batches[0][0] < since:
                self._batches.popleft()
            total = sum(seconds for _, seconds in self._batches)
        return min(1.0, total / (self.BUSY_WINDOW_S * len(self._workers)))

    @property
    def has_headroom(self) -> bool:
        return self.busy < self.BOOST_MAX_BUSY

    def _submit(self, frame: av.VideoFrame, stream: int, future: asyncio.Future[BatchResult]) -> None:
        """On a conversion thread: the frame into a free slot of its stream's block, then its fields to the worker."""
        image = to_bgr(frame)
        shape = (image.shape[0], image.shape[1], image.shape[2] if image.ndim == 3 else 1)
        released: tuple[int, str] | None = None
        with self._lock:
            block = self._streams.get(stream)
            if block is not None and block.shape != shape and not any(block.busy):
                released = (block.worker, block.memory.name)
                _unlink(block.memory)
                block = None
            if block is None:
                block = _StreamBlock(self._new_block(shape), shape, [False] * SLOTS_PER_STREAM,
                                     self._least_loaded(), time.monotonic())
                self._streams[stream] = block
            worker = self._workers[block.worker]
            if not worker.ready:
                telemetry.DETECTOR_OUTAGE_FRAMES.inc()
                raise DetectorOutage(f"detector worker {worker.index} is restarting")
            if block.shape != shape or all(block.busy):  # its worker still reads an older frame of this stream
                raise DetectorOutage(f"detector worker {worker.index} has not answered this stream's last frames")
            slot = block.busy.index(False)
            block.busy[slot] = True
            block.last_used = time.monotonic()
            request_id = next(self._request_ids)
            worker.inflight[request_id] = _InFlight(future, stream, slot, time.monotonic())
            conn, name = worker.conn, block.memory.name
        if released is not None:
            self._send(self._workers[released[0]], ("release", released[1]))
        view = np.ndarray(image.shape, np.uint8, buffer=block.memory.buf, offset=slot * block.slot_bytes)
        view[...] = image
        del view
        assert conn is not None
        try:
            with worker.send_lock:
                conn.send(("frame", request_id, stream, name, slot * block.slot_bytes, image.shape))
        except (OSError, ValueError) as error:  # the worker just died: the monitor restarts it
            with self._lock:
                lost = worker.inflight.pop(request_id, None)
                if lost is not None:
                    block.busy[slot] = False
            if lost is not None:
                telemetry.DETECTOR_OUTAGE_FRAMES.inc()
                raise DetectorOutage(f"detector worker {worker.index} is gone ({error})") from error

    def _new_block(self, shape: tuple[int, int, int]) -> SharedMemory:
        size = shape[0] * shape[1] * shape[2] * SLOTS_PER_STREAM
        return SharedMemory(f"{SHM_PREFIX}{os.getpid()}-{next(_block_ids)}", create=True, size=size)

    def _least_loaded(self) -> int:
        counts = [0] * len(self._workers)
        for block in self._streams.values():
            counts[block.worker] += 1
        return counts.index(min(counts))

    # ------------------------------------------------------------------ workers

    def _spawn(self, worker: _Worker) -> None:
        ours, theirs = self._context.Pipe(duplex=True)
        process = self._context.Process(
            target=serve, name=f"vigil-detector-{worker.index}", daemon=True,
            args=(worker.index, self.config, theirs),
            kwargs={"max_batch": self.max_batch, "max_wait_ms": self.max_wait_ms, "nice": self.nice,
                    "heartbeat_s": HEARTBEAT_S})
        process.start()
        theirs.close()  # the child holds its end: EOF here when it dies
        with self._lock:
            worker.process, worker.conn, worker.ready = process, ours, False
            worker.started_at = worker.last_heard = time.monotonic()
            worker.start_error = None
            worker.ready_event.clear()
        threading.Thread(target=self._read, args=(worker, ours), name=f"detector-{worker.index}-reader",
                         daemon=True).start()

    def _read(self, worker: _Worker, conn: Connection) -> None:
        """One per worker process: its answers, heartbeats and batch reports, until its pipe closes."""
        try:
            while True:
                message = conn.recv()
                kind = message[0]
                entry: _InFlight | None = None
                with self._lock:
                    if worker.conn is not conn:
                        return  # a lost worker's last words
                    worker.last_heard = time.monotonic()
                    if kind in ("result", "failed"):
                        entry = worker.inflight.pop(message[1], None)
                        if entry is not None:
                            block = self._streams.get(entry.stream)
                            if block is not None:
                                block.busy[entry.slot] = False
                    elif kind == "batch":
                        self._batches.append((time.monotonic(), message[2] / 1000.0))
                if kind == "result" and entry is not None:
                    detections: list[Detection] = message[2]
                    self._settle(entry.future, BatchResult(detections, message[3], message[4]))
                elif kind == "failed" and entry is not None:
                    self._settle(entry.future, RuntimeError(f"detection failed in worker {worker.index}: "
                                                            f"{message[2]}"))
                elif kind == "batch":
                    if self._metrics is not None:
                        self._metrics.observe(message[1], message[2])
                elif kind == "ready":
                    self._became_ready(worker, message[1])
                elif kind == "start_failed":
                    worker.start_error = message[1]
                    log.error("detector worker %d could not load its model: %s", worker.index, message[1])
        except (EOFError, OSError):
            return

    def _became_ready(self, worker: _Worker, description: dict[str, Any]) -> None:
        info = DetectorInfo(description["name"], description["device"], description["names"],
                            description["classes"])
        with self._lock:
            worker.ready = True
            worker.failed_starts = 0
            self.detector, self.name = info, info.name
            if self._metrics is None:
                self._metrics = telemetry.InferenceMetrics(info.name)
        worker.ready_event.set()
        assert worker.process is not None
        telemetry.DETECTOR_WORKER_PID.labels(worker=str(worker.index)).set(worker.process.pid or 0)

    def _settle(self, future: asyncio.Future[BatchResult], outcome: BatchResult | BaseException) -> None:
        loop = self._loop
        if loop is None:
            return

        def settle() -> None:
            if future.done():
                return
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)

        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(settle)

    def _send(self, worker: _Worker, message: tuple[Any, ...]) -> None:
        with contextlib.suppress(OSError, ValueError), worker.send_lock:
            if worker.conn is not None and worker.ready:
                worker.conn.send(message)

    def _alive(self, worker: _Worker) -> bool:
        return worker.process is not None and worker.process.is_alive()

    def _watch(self) -> None:
        """The monitor thread: restarts lost workers, frees idle streams' blocks."""
        next_sweep = time.monotonic() + IDLE_BLOCK_S
        while not self._closed.wait(0.2):
            now = time.monotonic()
            for worker in self._workers:
                reason = self._trouble(worker, now)
                if reason is not None and not self._closed.is_set():
                    self._restart(worker, reason)
            if now >= next_sweep:
                next_sweep = now + IDLE_BLOCK_S / 4
                self._free_idle_blocks(now)

    def _trouble(self, worker: _Worker, now: float) -> str | None:
        with self._lock:
            if not self._alive(worker):
                return "died"
            if not worker.ready:
                if worker.start_error is not None:
                    return "start_failed"
                return "start_timeout" if now - worker.started_at > self.start_timeout_s else None
            oldest = min((entry.sent_at for entry in worker.inflight.values()), default=now)
            if now - worker.last_heard > self.answer_timeout_s or now - oldest > self.answer_timeout_s:
                return "hung"
        return None

    def _restart(self, worker: _Worker, reason: str) -> None:
        was_ready = worker.ready
        pid = worker.process.pid if worker.process is not None else None
        if was_ready:
            log.warning("detector worker %d (pid %s) %s: restarting it", worker.index, pid, reason)
            telemetry.DETECTOR_OUTAGES.labels(reason=reason).inc()
        telemetry.DETECTOR_WORKER_PID.labels(worker=str(worker.index)).set(0)
        self._kill(worker)  # dead for sure before its slots are freed: a hung worker may still be reading them
        self._fail_inflight(worker, f"detector worker {worker.index} {reason}; restarting it", count=True)
        if not was_ready:
            worker.failed_starts += 1
            backoff = RESTART_BACKOFF_S[min(worker.failed_starts, len(RESTART_BACKOFF_S)) - 1]
            if self._closed.wait(backoff):
                return
        self._spawn(worker)

    def _kill(self, worker: _Worker) -> None:
        with self._lock:
            process, conn = worker.process, worker.conn
            worker.ready, worker.conn = False, None
        if process is not None and process.is_alive():
            process.kill()
        if process is not None:
            process.join(5.0)
        if conn is not None:
            conn.close()

    def _fail_inflight(self, worker: _Worker, why: str, *, count: bool) -> None:
        with self._lock:
            lost, worker.inflight = worker.inflight, {}
            for entry in lost.values():
                block = self._streams.get(entry.stream)
                if block is not None:
                    block.busy[entry.slot] = False
        if count and lost:
            telemetry.DETECTOR_OUTAGE_FRAMES.inc(len(lost))
        for entry in lost.values():
            self._settle(entry.future, DetectorOutage(why))

    def _free_idle_blocks(self, now: float) -> None:
        with self._lock:
            idle = [stream for stream, block in self._streams.items()
                    if now - block.last_used > IDLE_BLOCK_S and not any(block.busy)]
            blocks = [self._streams.pop(stream) for stream in idle]
        for block in blocks:
            self._send(self._workers[block.worker], ("release", block.memory.name))
            _unlink(block.memory)


def _unlink(memory: SharedMemory) -> None:
    with contextlib.suppress(BufferError):
        memory.close()
    with contextlib.suppress(FileNotFoundError):
        memory.unlink()
