"""``backend: openvino``: YOLO (detect or pose) on Intel's OpenVINO runtime (CPU), behind the detector protocol; the
default on x86-64 (``models/detectors/__init__.py`` ``default_backend``).

The IR is exported offline from the weights (the packaged yolo11n-pose.pt by default) by Ultralytics' own exporter
(``export(format="openvino", dynamic=True)``, ~5 s) into ``cache_dir``, keyed by the weights' hash, at set-up
(``scripts/setup.sh``) or on the first load (``export_ir`` below). Pre- and post-processing are Ultralytics' own, as
its predictor applies them to the torch model: the same letterbox (the smallest stride-32 rectangle when every image
of a batch has one shape, else the square ``imgsz``), the same NMS, the same box and keypoint rescaling, so
detections match the ``yolo`` backend's within the tolerance stated in
``tests/integration/test_openvino_detector.py``.

The IR's input is dynamic; each input shape gets its own static compiled model (0.2-0.4 s to compile here, and
faster than running a dynamic one: 1.05-1.2x with only the batch dynamic). A batch runs in chunks whose sizes are
powers of two up to ``max_chunk`` (7 = 4 + 2 + 1), so a letterbox shape needs at most three compiled models, not one
per batch size: compiling a new model for each batch size 1..8 as nine cameras started stalled detection for
seconds (bench/events.py lost runners in its first pass), and the eight kept took +711 MB (1, 2, 4: +206 MB). Per
image, a chunk of 2 or 4 costs what one of 8 does here (13.5-13.8 ms against 15 ms alone, yolo11n-pose at 384x640,
one thread). Only a shape's single-image model is compiled while a batch waits; the larger chunks are compiled on a
background thread, and until they are ready the batch runs in the chunks that are."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal

import numpy as np
import yaml
from pydantic import Field

from models.detectors import DETECTORS, Detection, Detector
from models.detectors.yolo_output import YoloOutput
from models.packaged import DERIVED_MODELS_DIR, ModelNotAvailable
from models.registry import BackendConfig

log = logging.getLogger(__name__)

Precision = Literal["auto", "f32", "bf16"]
COMPILED_SHAPES = 12  # compiled models kept: chunk sizes (1, 2, 4) x letterbox shapes (camera aspect ratios, square)


def default_threads() -> int:
    """One core left to the voice loop and the event loop: max(1, usable cores - 1)."""
    return max(1, len(os.sched_getaffinity(0)) - 1)


def export_ir(weights: str | None, cache_dir: str | Path) -> Path:
    """The OpenVINO IR directory of ``weights`` (a .pt, exported once into ``cache_dir``; or an IR directory,
    used as is). Blocking; seconds on the first call, then a lookup. Never downloads: Ultralytics' OpenVINO
    exporter needs only the ``openvino`` package."""
    if weights is not None and Path(weights).expanduser().is_dir():
        directory = Path(weights).expanduser()
        if not any(directory.glob("*.xml")):
            raise ModelNotAvailable(f"{directory} holds no OpenVINO IR (.xml): export one or point "
                                    "models.detector.weights at a .pt file")
        return directory
    from models.detectors.yolo import resolve_weights  # deferred: backends register in module order

    source = resolve_weights(weights)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = Path(cache_dir).expanduser() / f"{source.stem}-{digest}_openvino_model"
    if any(target.glob("*.xml")):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from ultralytics import YOLO

    log.info("exporting %s to OpenVINO IR in %s (once)", source.name, target)
    # Ultralytics writes the IR beside the weights (the packaged ones live in site-packages): export a copy, in
    # the cache's own folder so the final rename stays on one file system.
    with tempfile.TemporaryDirectory(prefix=".export-", dir=target.parent) as tmp:
        copy = Path(shutil.copy(source, Path(tmp) / source.name))
        exported = Path(YOLO(str(copy)).export(format="openvino", dynamic=True, half=False, device="cpu",
                                               verbose=False))
        try:
            exported.rename(target)
        except OSError:  # another process exported it meanwhile: theirs is as good
            if not any(target.glob("*.xml")):
                raise
    return target


class OpenVinoDetector:
    """``detect`` is blocking (the batcher runs it on its inference thread)."""

    device = "cpu"

    def __init__(self, weights: str | None = None, *, cache_dir: str | Path, imgsz: int = 640,
                 conf: float = 0.25, classes: list[int] | None = None, threads: int | None = None,
                 precision: Precision = "auto", iou: float = 0.7, max_det: int = 300, max_chunk: int = 4) -> None:
        import openvino as ov

        directory = export_ir(weights, cache_dir)
        xml = next(directory.glob("*.xml"))
        metadata: dict[str, Any] = yaml.safe_load((directory / "metadata.yaml").read_text()) or {}
        self.task: str = metadata.get("task", "detect")
        self.names: dict[int, str] = {int(k): str(v) for k, v in (metadata.get("names") or {}).items()}
        self.kpt_shape: tuple[int, int] = tuple(metadata.get("kpt_shape") or (17, 3))  # type: ignore[assignment]
        self.stride = int(metadata.get("stride", 32))
        self.imgsz, self.conf, self.classes, self.iou, self.max_det = imgsz, conf, classes, iou, max_det
        self.threads = threads or default_threads()
        self._core = ov.Core()
        self._model = self._core.read_model(str(xml))
        self._properties: dict[str, Any] = {
            "PERFORMANCE_HINT": "LATENCY",
            "INFERENCE_NUM_THREADS": self.threads,
            # Unpinned: on a CPU shared with the voice loop the scheduler must be free to move our thread.
            "ENABLE_CPU_PINNING": False,
        }
        if precision != "auto":  # auto: the plugin's choice (bf16 where the CPU has it, else f32)
            self._properties["INFERENCE_PRECISION_HINT"] = precision
        self.chunk_sizes = [1 << bit for bit in range(max(1, max_chunk).bit_length()) if 1 << bit <= max_chunk]
        self._compiled: OrderedDict[tuple[int, ...], Any] = OrderedDict()
        self._compiled_lock = threading.Lock()  # _compiled is read by detect and written by the background compiler
        self._compiling: dict[tuple[int, ...], Future[None]] = {}
        self._compiler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="openvino-compile")
        self._lock = threading.Lock()
        self.detect([np.zeros((imgsz, imgsz, 3), np.uint8)])  # warm-up: compiles the square shape
        square = self._compiled[(1, 3, imgsz, imgsz)]  # the warm-up compiled it: nothing else has run yet
        self.precision = square.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # what auto chose: bf16, f32
        self.name = f"{xml.stem}@{imgsz}/openvino-{self.precision}"
        log.info("OpenVINO detector %s: %d thread(s)", self.name, self.threads)

    def _compile(self, shape: tuple[int, ...]) -> Any:
        model = self._model.clone()
        model.reshape(list(shape))
        compiled = self._core.compile_model(model, "CPU", self._properties)
        with self._compiled_lock:
            self._compiled[shape] = compiled
            self._compiled.move_to_end(shape)
            if len(self._compiled) > COMPILED_SHAPES:
                self._compiled.popitem(last=False)
            self._compiling.pop(shape, None)
        return compiled

    def _compile_in_background(self, shape: tuple[int, ...]) -> None:
        try:
            self._compile(shape)
        except Exception:  # the batch goes on in smaller chunks; the next batch that could use it tries again
            log.exception("OpenVINO: compiling input shape %s failed", shape)
            with self._compiled_lock:
                self._compiling.pop(shape, None)

    def _ready(self, shape: tuple[int, ...]) -> Any | None:
        with self._compiled_lock:
            compiled = self._compiled.get(shape)
            if compiled is not None:
                self._compiled.move_to_end(shape)
            return compiled

    def _chunks(self, count: int, image_shape: tuple[int, ...]) -> list[tuple[int, Any]]:
        """(size, compiled model) chunks that cover ``count`` images of ``image_shape`` (C, H, W): the largest
        compiled chunk size first. Sizes this batch could use that are not compiled yet are compiled in the
        background; only the single-image model, when missing, is compiled here (the batch needs it now)."""
        chunks: list[tuple[int, Any]] = []
        left = count
        for size in reversed(self.chunk_sizes):
            if size > left:
                continue
            shape = (size, *image_shape)
            compiled = self._ready(shape)
            if compiled is None and size > 1:
                with self._compiled_lock:
                    if shape not in self._compiling:
                        self._compiling[shape] = self._compiler.submit(self._compile_in_background, shape)
                continue
            if compiled is None:
                compiled = self._compile(shape)
            while left >= size:
                chunks.append((size, compiled))
                left -= size
        return chunks

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        if not images:
            return []
        batch = self._preprocess(images)
        outputs, start = [], 0
        with self._lock:
            for size, compiled in self._chunks(len(batch), batch.shape[1:]):
                outputs.append(compiled(batch[start:start + size])[0])
                start += size
        raw = outputs[0] if len(outputs) == 1 else np.concatenate(outputs)
        return self._postprocess(raw, batch.shape[2:], [image.shape for image in images])

    def compiled_shapes(self, wait: bool = False) -> list[tuple[int, ...]]:
        """The input shapes compiled now (``wait``: once the background compilations under way are done)."""
        if wait:
            with self._compiled_lock:
                pending = list(self._compiling.values())
            for future in pending:
                future.result()
        with self._compiled_lock:
            return list(self._compiled)

    def _preprocess(self, images: list[np.ndarray]) -> np.ndarray:
        from ultralytics.data.augment import LetterBox

        # As Ultralytics' predictor does for a .pt model: a minimal rectangle when the batch has one shape.
        same_shapes = len({image.shape for image in images}) == 1
        letterbox = LetterBox((self.imgsz, self.imgsz), auto=same_shapes, stride=self.stride)
        boxed = np.stack([letterbox(image=image) for image in images])
        batch = boxed[..., ::-1].transpose(0, 3, 1, 2)  # BGR→RGB, BHWC→BCHW
        return np.ascontiguousarray(batch, dtype=np.float32) / 255.0

    def _postprocess(self, raw: np.ndarray, input_hw: tuple[int, ...],
                     shapes: list[tuple[int, ...]]) -> list[list[Detection]]:
        output = YoloOutput(self.names, self.task, self.kpt_shape, self.conf, self.iou, self.classes, self.max_det)
        return output.decode(raw, input_hw, shapes)


def main() -> None:
    """``scripts/setup.sh``: export the packaged weights' IR into the default cache_dir (what
    ``scripts/setup.sh`` runs, offline, so that the first start serves at once); prints its directory."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    print(export_ir(None, str(DERIVED_MODELS_DIR / "openvino")))  # the backend's default cache_dir


DEFAULT_CACHE_DIR = DERIVED_MODELS_DIR / "openvino"


class OpenVinoConfig(BackendConfig):
    backend: Literal["openvino"] = "openvino"
    weights: str | None = Field(None, description="A .pt file (exported to IR once) or an OpenVINO IR directory; "
                                "None: the packaged yolo11n-pose.pt.")
    cache_dir: str = Field(str(DEFAULT_CACHE_DIR), description="Where exported IRs are kept (one folder per "
                           "weights file, keyed by its hash). The default is the checkout's data/models/openvino, "
                           "absolute so that any working directory finds the IR scripts/setup.sh exported.")
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = None
    threads: int | None = Field(None, ge=1, description="Inference threads; None: max(1, cores - 1), one core "
                                "left to the voice loop.")
    precision: Literal["auto", "f32", "bf16"] = Field(
        "auto", description="auto: OpenVINO's choice (bf16 on CPUs that have it, else f32).")
    max_chunk: int = Field(4, ge=1, le=64, description="A batch runs in chunks of powers of two up to this (7 "
                           "frames: 4 + 2 + 1), each chunk size a compiled model per frame shape (~50-115 MB each). "
                           "Per image a chunk of 2 or 4 cost what one of 8 does on a 2-core CPU; a CPU with many "
                           "cores may gain from 8 or more.")


@DETECTORS.register(OpenVinoConfig)
def build(config: OpenVinoConfig) -> Detector:
    return OpenVinoDetector(config.weights, cache_dir=config.cache_dir, imgsz=config.imgsz, conf=config.conf,
                            classes=config.classes, threads=config.threads, precision=config.precision,
                            max_chunk=config.max_chunk)
