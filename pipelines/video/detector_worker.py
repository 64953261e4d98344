"""The body of a detector worker process (``video.detector_workers`` >= 1; the server's side is
``pipelines.video.workers``).

The process loads the configured detector itself and serves one control pipe. Frames arrive as
``("frame", request_id, stream, shm_name, offset, shape)``: the BGR pixels are already in the server's shared memory,
so only those few fields are pickled; the pixels are read in place. The process batches across streams with the same
``InferenceBatcher`` the server uses in process, and answers each frame with its detections (a few small objects,
never pixels). On a GPU each batch is padded to a fixed size (``PaddedDetector``), so the shapes a CUDA graph or a
TensorRT engine was built for stay the only shapes it sees. A heartbeat goes out every ``heartbeat_s`` so the server
can tell a hung process from a quiet one. When the pipe closes (the server stopped or died) the process exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from models.detectors import Detection, Detector, load_detector
from models.registry import BackendConfig
from pipelines.video.batcher import InferenceBatcher


def fixed_batch_sizes(max_batch: int) -> tuple[int, ...]:
    """Powers of two up to ``max_batch``, and ``max_batch`` itself: the only batch sizes a padded detector runs."""
    sizes = [1]
    while sizes[-1] * 2 < max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


class PaddedDetector:
    """Runs every batch at one of a few fixed sizes, repeating the last image as padding (same shape, so the
    letterbox does not change) and dropping the padding's results: per-shape autotuning, CUDA graphs and TensorRT
    engines see the same shapes again instead of every size from 1 to ``max_batch``."""

    def __init__(self, inner: Detector, max_batch: int) -> None:
        self.inner, self.name, self.device = inner, inner.name, inner.device
        self.sizes = fixed_batch_sizes(max_batch)

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        size = next((s for s in self.sizes if s >= len(images)), len(images))
        padded = images + [images[-1]] * (size - len(images))
        return self.inner.detect(padded)[: len(images)]

    def __getattr__(self, name: str) -> Any:  # names, classes, model: what the label checks read
        return getattr(self.inner, name)


def describe(detector: Detector) -> dict[str, Any]:
    """What the server needs to know of the loaded detector (its name, device and labels), picklable."""
    names = getattr(detector, "names", None) or getattr(getattr(detector, "model", None), "names", None)
    classes = getattr(detector, "classes", None)
    return {"name": detector.name, "device": detector.device,
            "names": {int(k): str(v) for k, v in names.items()} if isinstance(names, dict) else None,
            "classes": list(classes) if classes is not None else None}


def serve(index: int, config: BackendConfig, conn: Connection, *, max_batch: int, max_wait_ms: float, nice: int,
          heartbeat_s: float) -> None:
    """The worker process's entry point (spawned: nothing of the server's state is inherited)."""
    if nice > 0:
        with contextlib.suppress(OSError):
            os.nice(nice)  # the whole process: on a shared CPU the voice loop in the server goes first
    try:
        detector = load_detector(config)
        if detector is None:
            raise ValueError("models.detector.backend is 'none': there is no detector to run")
        if detector.device.startswith("cuda"):
            detector = PaddedDetector(detector, max_batch)  # type: ignore[assignment]
    except Exception as error:
        conn.send(("start_failed", f"{type(error).__name__}: {error}"))
        return
    conn.send(("ready", describe(detector)))
    asyncio.run(_serve(detector, conn, max_batch=max_batch, max_wait_ms=max_wait_ms, heartbeat_s=heartbeat_s))


async def _serve(detector: Detector, conn: Connection, *, max_batch: int, max_wait_ms: float,
                 heartbeat_s: float) -> None:
    loop = asyncio.get_running_loop()
    closed = asyncio.Event()
    memory: dict[str, SharedMemory] = {}
    tasks: set[asyncio.Task[None]] = set()

    def send(message: tuple[Any, ...]) -> None:  # only ever called on this loop's thread: no lock needed
        with contextlib.suppress(OSError):
            conn.send(message)

    batcher = InferenceBatcher(detector, max_batch=max_batch, max_wait_ms=max_wait_ms,
                               on_batch=lambda size, ms: send(("batch", size, ms)))

    async def answer(request_id: int, stream: int, name: str, offset: int, shape: tuple[int, ...]) -> None:
        try:
            if name not in memory:
                memory[name] = SharedMemory(name)
            image = np.ndarray(shape, np.uint8, buffer=memory[name].buf, offset=offset)
            result = await batcher.detect_image(image, stream)
            del image  # the slot is the server's again once answered: hold no view of it
            send(("result", request_id, result.detections, result.inference_ms, result.batch_size))
        except Exception as error:
            send(("failed", request_id, f"{type(error).__name__}: {error}"))

    def handle(message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "frame":
            task = loop.create_task(answer(*message[1:]))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        elif kind == "release":  # the server unlinked a stream's block: drop this process's mapping too
            block = memory.pop(message[1], None)
            if block is not None:
                with contextlib.suppress(BufferError):
                    block.close()
        elif kind == "stop":
            closed.set()

    def read() -> None:
        try:
            while True:
                loop.call_soon_threadsafe(handle, conn.recv())
        except (EOFError, OSError):  # the server closed the pipe, or died: nobody to answer any more
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(closed.set)

    threading.Thread(target=read, name="control", daemon=True).start()
    while not closed.is_set():
        send(("alive",))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(closed.wait(), heartbeat_s)
    for task in list(tasks):
        task.cancel()
    await batcher.close()
    for block in memory.values():
        with contextlib.suppress(BufferError):
            block.close()
