"""Detector runtimes side by side: ms per frame of yolo11n-pose (the packaged weights) at one ``--imgsz`` on real
photos (Ultralytics' bus and zidane, alternating, one image per call), in ONE run:

* torch: the ``yolo`` backend, as the default config runs it (Ultralytics' predictor, its own thread count);
* OpenVINO auto: the ``openvino`` backend with ``precision: auto`` (bf16 where the CPU has it);
* OpenVINO f32: the same with ``precision: f32``;
* ONNX Runtime: Ultralytics' ONNX export (dynamic shapes, so the same letterbox as the others) on onnxruntime's
  CPU provider, with the OpenVINO backend's (Ultralytics') pre- and post-processing.

Every runtime gets the same number of threads as the OpenVINO backend's default (cores - 1; torch's is set by
Ultralytics to the same). Legs run A B C D D C B A (``--frames`` per leg) so drift on a shared machine spreads
over all; the table shows each runtime's median over all its frames, its legs' medians, and its ratio to torch.
The exports are cached in ``.cache/bench-detectors/``; nothing is downloaded.

Run (about a minute on 2 CPU cores)::

    cd /work/main && .venv/bin/python -m bench.detectors
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")  # before anything imports ultralytics

import argparse
import ast
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from models.detectors import Detection, Detector
from models.detectors.openvino import OpenVinoDetector, default_threads, export_ir
from models.detectors.yolo import UltralyticsDetector
from models.packaged import yolo_pose_weights
from tests.support.media import real_image

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "bench-detectors"


class OnnxRuntimeDetectorForBench(OpenVinoDetector):
    """The OpenVINO backend's pre/post-processing around an onnxruntime session instead of OpenVINO."""

    def __init__(self, onnx_path: Path, *, imgsz: int, threads: int) -> None:
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
        self.session = onnxruntime.InferenceSession(str(onnx_path), options, providers=["CPUExecutionProvider"])
        meta = self.session.get_modelmeta().custom_metadata_map  # Ultralytics writes its metadata here
        self.task, self.names = meta["task"], ast.literal_eval(meta["names"])
        self.kpt_shape = tuple(ast.literal_eval(meta["kpt_shape"]))
        self.stride, self.imgsz, self.conf, self.classes, self.iou, self.max_det = 32, imgsz, 0.25, None, 0.7, 300
        self.threads, self.name = threads, f"{onnx_path.stem}@{imgsz}/onnxruntime"

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        batch = self._preprocess(images)
        raw = self.session.run(None, {self.session.get_inputs()[0].name: batch})[0]
        return self._postprocess(raw, batch.shape[2:], [image.shape for image in images])


def onnx_export(imgsz: int) -> Path:
    target = CACHE / f"yolo11n-pose-dynamic-{imgsz}.onnx"
    if not target.is_file():
        from ultralytics import YOLO

        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=CACHE) as tmp:  # Ultralytics writes beside the weights
            copy = shutil.copy(yolo_pose_weights(), Path(tmp) / "yolo11n-pose.pt")
            exported = YOLO(str(copy)).export(format="onnx", dynamic=True, simplify=False, imgsz=imgsz,
                                              device="cpu", verbose=False)
            Path(exported).rename(target)
    return target


def leg(detector: Detector, photos: list[np.ndarray], frames: int) -> list[float]:
    times = []
    for i in range(frames):
        start = time.perf_counter()
        detector.detect([photos[i % len(photos)]])
        times.append((time.perf_counter() - start) * 1000)
    return times


def main(opts: argparse.Namespace) -> None:
    import torch

    threads = opts.threads or default_threads()
    photos = [cv2.cvtColor(real_image(name), cv2.COLOR_RGB2BGR) for name in ("bus", "zidane")]
    export_ir(None, CACHE)
    detectors: dict[str, Detector] = {
        "torch": UltralyticsDetector(imgsz=opts.imgsz),
        "OpenVINO auto": OpenVinoDetector(cache_dir=CACHE, imgsz=opts.imgsz, threads=threads, precision="auto"),
        "OpenVINO f32": OpenVinoDetector(cache_dir=CACHE, imgsz=opts.imgsz, threads=threads, precision="f32"),
        "ONNX Runtime": OnnxRuntimeDetectorForBench(onnx_export(opts.imgsz), imgsz=opts.imgsz, threads=threads),
    }
    for detector in detectors.values():  # warm-up: every photo's shape compiled / allocated
        leg(detector, photos, 2 * len(photos))
    order = [*detectors, *reversed(detectors)]
    times: dict[str, list[float]] = {name: [] for name in detectors}
    legs: dict[str, list[float]] = {name: [] for name in detectors}
    for name in order:
        measured = leg(detectors[name], photos, opts.frames)
        times[name] += measured
        legs[name].append(statistics.median(measured))
    torch_ms = statistics.median(times["torch"])
    print(f"yolo11n-pose @{opts.imgsz}, bus + zidane alternating, batch 1, {opts.frames} frames per leg, "
          f"legs {' '.join(order)}; threads: torch {torch.get_num_threads()}, others {threads}; "
          f"{len(os.sched_getaffinity(0))} cores")
    print(f"{'runtime':<15} {'precision':<10} {'ms/frame':>9} {'legs (median)':>17} {'÷ torch':>8}")
    for name, detector in detectors.items():
        precision = getattr(detector, "precision", "f32")
        median = statistics.median(times[name])
        spread = " / ".join(f"{ms:.1f}" for ms in legs[name])
        print(f"{name:<15} {precision:<10} {median:>9.1f} {spread:>17} {median / torch_ms:>8.2f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--frames", type=int, default=30, help="frames per leg (each runtime runs two legs)")
    parser.add_argument("--threads", type=int, default=None, help="default: cores - 1 (the backend's default)")
    return parser.parse_args(argv)


if __name__ == "__main__":
    main(parse_args())
