"""``backend: triton``: a YOLO model served by NVIDIA Triton Inference Server (below).

``weights`` are what ``vigil export-detector`` exports into Triton's model repository; ``triton`` says where it
is served. One cross-stream batch is one Triton request.

A YOLO detector (detect or pose) served by NVIDIA Triton Inference Server, behind the detector protocol.

Each cross-stream batch from the video batcher goes to Triton as ONE inference request (Triton's dynamic batcher
then merges the requests of several Vigil nodes on the GPU). Pre- and post-processing are Ultralytics' own
(letterbox, NMS, box and keypoint rescaling), so results match the local backend's within rounding.

Failure model: every request has a deadline (``timeout_s``); when Triton cannot be reached the call raises
``DetectorUnavailable`` at once (no queueing behind a dead server), and for ``retry_interval_s`` after a failure
calls fail fast without touching the network. gRPC/HTTP connections are re-established by the client on the next
attempt, so detections resume by themselves when Triton is back.

The model repository comes from ``vigil export-detector`` (``export_model_repository`` below): ONNX with a dynamic
batch axis and a ``config.pbtxt`` whose ``metadata`` parameter (Ultralytics' format) carries task, class names
and keypoint shape."""

from __future__ import annotations

import ast
import logging
import threading
import time
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from models.detectors import DETECTORS, Detection, Detector
from models.detectors.yolo_output import YoloOutput
from models.registry import BackendConfig

log = logging.getLogger(__name__)


class TritonDetectorConfig(BaseModel):
    """``models.detector.triton``: where the model is served (used when ``models.detector.backend`` is triton)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    url: str = Field("grpc://127.0.0.1:8001", description="grpc://host:port (default port 8001) or "
                     "http://host:port (8000).")
    model: str = Field("yolo", min_length=1, description="Model name in Triton's repository.")
    version: str = Field("", description="Model version; empty: Triton's policy (latest).")
    task: Literal["detect", "pose"] | None = Field(
        None, description="None: from the model's metadata parameter (written by vigil export-detector).")
    labels: list[str] | None = Field(None, description="Class names by id; None: from the model's metadata.")
    timeout_s: float = Field(5.0, gt=0, description="Deadline of one inference request.")
    retry_interval_s: float = Field(1.0, ge=0, description="After a failure, calls fail fast this long before "
                                    "Triton is tried again.")
    iou: float = Field(0.7, gt=0, le=1, description="NMS IoU threshold (Ultralytics' default).")
    max_det: int = Field(300, ge=1)


class DetectorUnavailable(RuntimeError):
    """The inference server cannot be reached (or failed): a transient, per-frame condition, not a bad frame."""

    code = "detector_unavailable"


class _Client:
    """The two tritonclient flavours behind one small interface (both blocking: we run on the batcher's thread)."""

    def __init__(self, url: str, timeout_s: float) -> None:
        parts = urlsplit(url if "://" in url else f"grpc://{url}")
        self.scheme = parts.scheme
        if parts.scheme == "grpc":
            import tritonclient.grpc as module

            self.module = module
            self.client = module.InferenceServerClient(f"{parts.hostname}:{parts.port or 8001}")
        elif parts.scheme == "http":
            import tritonclient.http as module  # its transport is geventhttpclient (a dependency)

            self.module = module
            self.client = module.InferenceServerClient(f"{parts.hostname}:{parts.port or 8000}",
                                                       connection_timeout=timeout_s, network_timeout=timeout_s)
        else:
            raise ValueError(f"models.detector.triton.url must start with grpc:// or http://, got {url!r}")
        self.timeout_s = timeout_s

    def model_config(self, model: str, version: str) -> dict[str, Any]:
        if self.scheme == "grpc":
            answer = self.client.get_model_config(model, version, as_json=True, client_timeout=self.timeout_s)
            return answer.get("config", {})
        return self.client.get_model_config(model, version)

    def model_metadata(self, model: str, version: str) -> dict[str, Any]:
        if self.scheme == "grpc":
            return self.client.get_model_metadata(model, version, as_json=True, client_timeout=self.timeout_s)
        return self.client.get_model_metadata(model, version)

    def infer(self, model: str, version: str, input_name: str, output_name: str, batch: np.ndarray) -> np.ndarray:
        tensor = self.module.InferInput(input_name, list(batch.shape), "FP32")
        tensor.set_data_from_numpy(batch)
        output = self.module.InferRequestedOutput(output_name)
        options: dict[str, Any] = {"client_timeout": self.timeout_s} if self.scheme == "grpc" else {}
        result = self.client.infer(model, [tensor], model_version=version, outputs=[output], **options)
        return result.as_numpy(output_name)

    def close(self) -> None:
        self.client.close()


class TritonDetector:
    """``detect`` is blocking (the batcher runs it on its inference thread)."""

    device = "triton"

    def __init__(self, config: TritonDetectorConfig, *, imgsz: int = 640, conf: float = 0.25,
                 classes: list[int] | None = None) -> None:
        self.config, self.imgsz, self.conf, self.classes = config, imgsz, conf, classes
        self.name = f"{config.model}@triton"
        self._client = _Client(config.url, config.timeout_s)
        self._lock = threading.Lock()
        self._described = False
        self._failed_at: float | None = None
        self._last_error = ""
        self.task: str = config.task or "detect"
        self.names: dict[int, str] = dict(enumerate(config.labels or []))
        self.kpt_shape: tuple[int, int] = (17, 3)
        self.input_name, self.output_name = "images", "output0"
        try:
            self._describe()
        except DetectorUnavailable as error:  # Triton may come up after us: the first frames will say so
            log.warning("%s", error)

    # ------------------------------------------------------------------ connection

    def _fail(self, error: Exception) -> DetectorUnavailable:
        self._failed_at = time.monotonic()
        if self._last_error != str(error):
            log.warning("Triton at %s failed: %s", self.config.url, error)
        self._last_error = str(error)
        return DetectorUnavailable(f"Triton inference server at {self.config.url} (model {self.config.model!r}) "
                                   f"is unavailable: {_short(error)}")

    def _describe(self) -> None:
        """Read inputs, outputs and the Ultralytics metadata (task, names, keypoints) from the served model."""
        try:
            metadata = self._client.model_metadata(self.config.model, self.config.version)
            model_config = self._client.model_config(self.config.model, self.config.version)
        except Exception as error:
            raise self._fail(error) from error
        self.input_name = metadata["inputs"][0]["name"]
        self.output_name = metadata["outputs"][0]["name"]
        parameters = model_config.get("parameters", {})
        raw = parameters.get("metadata", {}).get("string_value")
        described: dict[str, Any] = ast.literal_eval(raw) if raw else {}
        if self.config.task is None and described.get("task") in ("detect", "pose"):
            self.task = described["task"]
        if not self.config.labels and described.get("names"):
            self.names = {int(k): str(v) for k, v in described["names"].items()}
        if described.get("kpt_shape"):
            self.kpt_shape = tuple(described["kpt_shape"])  # type: ignore[assignment]
        if not self.names and self.task == "pose":
            self.names = {0: "person"}
        self._described = True

    # ------------------------------------------------------------------ inference

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        with self._lock:
            if self._failed_at is not None and time.monotonic() - self._failed_at < self.config.retry_interval_s:
                raise DetectorUnavailable(f"Triton inference server at {self.config.url} is unavailable "
                                          f"(retrying every {self.config.retry_interval_s:g} s): {self._last_error}")
            if self._failed_at is not None:  # reconnect: a fresh channel, not one sitting in gRPC's backoff
                self._client.close()
                self._client = _Client(self.config.url, self.config.timeout_s)
            if not self._described:
                self._describe()
            batch, shapes = self._preprocess(images)
            try:
                raw = self._client.infer(self.config.model, self.config.version, self.input_name,
                                         self.output_name, batch)
            except Exception as error:
                raise self._fail(error) from error
            if self._failed_at is not None:
                log.info("Triton at %s is back", self.config.url)
            self._failed_at, self._last_error = None, ""
        return self._postprocess(raw, batch.shape[2:], shapes)

    def _preprocess(self, images: list[np.ndarray]) -> tuple[np.ndarray, list[tuple[int, ...]]]:
        from ultralytics.data.augment import LetterBox

        # A fixed square input (auto=False): one tensor shape for every batch, as the exported model expects.
        letterbox = LetterBox((self.imgsz, self.imgsz), auto=False, stride=32)
        boxed = np.stack([letterbox(image=image) for image in images])
        batch = boxed[..., ::-1].transpose(0, 3, 1, 2)  # BGR→RGB, BHWC→BCHW
        return np.ascontiguousarray(batch, dtype=np.float32) / 255.0, [image.shape for image in images]

    def _postprocess(self, raw: np.ndarray, input_hw: tuple[int, ...],
                     shapes: list[tuple[int, ...]]) -> list[list[Detection]]:
        output = YoloOutput(self.names, self.task, self.kpt_shape, self.conf, self.config.iou, self.classes,
                            self.config.max_det)
        return output.decode(raw, input_hw, shapes)

    def close(self) -> None:
        self._client.close()


# ---------------------------------------------------------------------- model repository

CONFIG_PBTXT = """name: "{name}"
backend: "onnxruntime"
max_batch_size: {max_batch}
input [
  {{
    name: "{input}"
    data_type: TYPE_FP32
    dims: [ 3, {imgsz}, {imgsz} ]
  }}
]
output [
  {{
    name: "{output}"
    data_type: TYPE_FP32
    dims: [ -1, -1 ]
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: {queue_delay_us}
}}
instance_group [
  {{
    count: 1
    kind: {kind}
  }}
]
parameters {{
  key: "metadata"
  value {{
    string_value: "{metadata}"
  }}
}}
"""


def export_model_repository(weights: str | None, repository: str, *, name: str = "yolo", imgsz: int = 640,
                            max_batch: int = 16, gpu: bool = True, queue_delay_us: int = 2000) -> Path:
    """Export YOLO weights to ``repository/name/1/model.onnx`` (dynamic batch axis) with its ``config.pbtxt``.

    Blocking, seconds. Runs offline: Ultralytics' ONNX exporter needs only the ``onnx`` package (simplification,
    which would need ``onnxslim``, is off). The weights are copied to a temporary folder first, because
    Ultralytics writes the .onnx beside them (the packaged weights live in site-packages).
    """
    import shutil
    import tempfile

    from ultralytics import YOLO

    from models.detectors.yolo import resolve_weights

    source = resolve_weights(weights)
    model_dir = Path(repository).expanduser() / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vigil-export-") as tmp:
        copy = Path(shutil.copy(source, Path(tmp) / source.name))
        model = YOLO(str(copy))
        onnx_path = Path(model.export(format="onnx", dynamic=True, simplify=False, imgsz=imgsz, batch=max_batch,
                                      device="cpu", verbose=False))
        shutil.move(str(onnx_path), model_dir / "1" / "model.onnx")
        metadata = {
            "task": model.task,
            "names": {int(k): str(v) for k, v in model.names.items()},
            "imgsz": [imgsz, imgsz],
            "stride": 32,
            "batch": max_batch,
            "description": f"Vigil export of {source.name}",
        }
        kpt_shape = getattr(model.model, "kpt_shape", None)
        if kpt_shape:
            metadata["kpt_shape"] = [int(v) for v in kpt_shape]
    (model_dir / "config.pbtxt").write_text(CONFIG_PBTXT.format(
        name=name, max_batch=max_batch, input="images", output="output0", imgsz=imgsz,
        queue_delay_us=queue_delay_us, kind="KIND_GPU" if gpu else "KIND_CPU",
        metadata=repr(metadata).replace("\\", "\\\\").replace('"', '\\"'),
    ))
    return model_dir


def read_repository_metadata(model_dir: Path) -> dict[str, Any]:
    """The ``metadata`` parameter of an exported ``config.pbtxt`` (for tools and tests that serve it)."""
    text = (model_dir / "config.pbtxt").read_text()
    raw = text.split('string_value: "', 1)[1].rsplit('"', 1)[0]
    return ast.literal_eval(raw.replace('\\"', '"').replace("\\\\", "\\"))


def _short(error: Exception) -> str:
    """tritonclient's gRPC errors carry a multi-line debug string: keep the status line."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return text[:300]


class TritonConfig(BackendConfig):
    backend: Literal["triton"] = "triton"
    weights: str | None = Field(None, description="Exported by `vigil export-detector`; None: the packaged "
                                "yolo11n-pose.pt.")
    imgsz: int = Field(640, ge=32)
    conf: float = Field(0.25, gt=0, lt=1)
    classes: list[int] | None = None
    triton: TritonDetectorConfig = TritonDetectorConfig()


@DETECTORS.register(TritonConfig)
def build(config: TritonConfig) -> Detector:
    return TritonDetector(config.triton, imgsz=config.imgsz, conf=config.conf, classes=config.classes)
