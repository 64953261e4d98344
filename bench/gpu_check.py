"""Pipeline ÷ raw detector at 1, 4, 8 and 16 streams, with detection in process and in worker processes
(``video.detector_workers``), on one device: the check ``scripts/gpu-check.sh`` runs on a lent GPU.

* raw: ``detector.detect`` in a tight loop on pre-converted BGR frames, in batches of min(streams, max_batch), in
  this process (the model's own ceiling on this device).
* pipeline: N ``SessionPipeline``s (wall clock, motion gating off, ``target_fps`` above the feed rate, so every
  fed frame goes to the detector; each is handed its next decoded frame when its worker takes the last one, as
  ``bench.video`` P1 does) over one shared detector: the in-process ``InferenceBatcher`` (``workers 0``) or
  ``DetectorWorkers`` with that many processes. Rate: the pipelines' ``frames_analyzed`` over ``--seconds`` after
  every stream got its first answer (model loading and first-call costs stay out).
* loop ms/frame: CPU time of the event-loop thread (``time.thread_time`` on it, as ``vigil_event_loop_load``
  measures it) per analysed frame: what each frame costs the thread that also reads every session's media.

The model is the packaged yolo11n-pose (``backend: yolo``; on CUDA in FP16, as ``bench.video``); nothing is
downloaded. Runs anywhere: ``--device cpu --seconds 5`` is the dry run (slow: the CPU is the model's limit there, so
ratios near 1 say only that the harness works). Legs run one after another; on a shared machine read the ratios
of one run, not the fps.

    .venv/bin/python -m bench.gpu_check --device cuda:0                       # a GPU host
    .venv/bin/python -m bench.gpu_check --device cpu --seconds 5 --streams 1,4 --workers 0,1   # dry run
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")  # before anything imports ultralytics
os.environ.setdefault("YOLO_AUTOINSTALL", "False")

import argparse
import asyncio
import contextlib
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import av

from bench.video import (
    FPS,
    SIZE,
    fed_pipelines,
    raw_leg,
    stop_fed,
)
from models.detectors import Detector, load_detector
from models.detectors.yolo import YoloConfig
from models.packaged import ModelNotAvailable
from pipelines.video.batcher import FrameDetector, InferenceBatcher, to_bgr
from pipelines.video.workers import DetectorWorkers
from tests.support.media import slideshow


@dataclass(slots=True)
class PipelineRate:
    frames: int
    seconds: float
    loop_cpu_s: float

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else float("nan")

    @property
    def loop_ms_per_frame(self) -> float:
        return 1000 * self.loop_cpu_s / self.frames if self.frames else float("nan")


async def pipeline_leg(batcher: FrameDetector, frames: list[av.VideoFrame], streams: int, seconds: float,
                       warmup_timeout_s: float = 300.0) -> PipelineRate:
    pipelines, feeders = fed_pipelines(batcher, frames, streams, "gpu-check")

    def analysed() -> int:
        return sum(p.counts.video.frames_analyzed for p in pipelines)

    try:
        deadline = time.monotonic() + warmup_timeout_s
        while not all(p.counts.video.frames_analyzed for p in pipelines):  # every stream answered once
            if time.monotonic() > deadline:
                failed = sum(p.counts.video.frames_failed for p in pipelines)
                raise RuntimeError(f"{streams} streams: not every stream was answered within {warmup_timeout_s} s "
                                   f"({failed} frames failed)")
            await asyncio.sleep(0.05)
        frames0, wall0, cpu0 = analysed(), time.perf_counter(), time.thread_time()  # on the loop's thread
        await asyncio.sleep(seconds)
        return PipelineRate(analysed() - frames0, time.perf_counter() - wall0, time.thread_time() - cpu0)
    finally:
        await stop_fed(pipelines, feeders)


def _cells(pipeline: PipelineRate, raw_fps: float) -> str:
    return f" | {pipeline.fps:>16.1f} {pipeline.fps / raw_fps:>6.2f} {pipeline.loop_ms_per_frame:>13.2f}"


async def main(opts: argparse.Namespace) -> list[str]:
    config = YoloConfig(imgsz=opts.imgsz, device=opts.device, half=opts.device.startswith("cuda"))
    with tempfile.TemporaryDirectory(prefix="vigil-gpu-check-") as tmp:
        clip = slideshow(Path(tmp) / "clip.mp4", [("bus", 2.0), ("zidane", 2.0), ("astronaut", 2.0)], fps=FPS,
                         size=SIZE)
        with av.open(str(clip)) as container:
            frames = list(container.decode(video=0))
    images = [to_bgr(frame) for frame in frames]
    detector: Detector | None = await asyncio.to_thread(load_detector, config)
    assert detector is not None
    print(f"{detector.name} on {detector.device}; streams {opts.streams}, detector workers {opts.workers}, "
          f"max_batch {opts.max_batch}, max_wait_ms {opts.max_wait_ms:g}, {opts.seconds:g} s per leg; "
          f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)

    raw: dict[int, float] = {}
    for streams in opts.streams:
        batch = min(streams, opts.max_batch)
        # Warm-up first: per-shape first-call costs (cuDNN autotuning, OpenVINO compiles) stay out of the rate.
        await asyncio.to_thread(raw_leg, detector, images, batch, min(1.0, opts.seconds / 4))
        raw[streams] = (await asyncio.to_thread(raw_leg, detector, images, batch, opts.seconds)).fps

    results: dict[tuple[int, int], PipelineRate] = {}
    for workers in opts.workers:
        batcher: FrameDetector
        if workers == 0:
            batcher = InferenceBatcher(detector, max_batch=opts.max_batch, max_wait_ms=opts.max_wait_ms)
        else:
            pool = DetectorWorkers(config, workers=workers, max_batch=opts.max_batch, max_wait_ms=opts.max_wait_ms)
            started = time.perf_counter()
            await asyncio.to_thread(pool.start)
            print(f"  {workers} worker process(es) started in {time.perf_counter() - started:.1f} s", flush=True)
            batcher = pool
        try:
            for streams in opts.streams:
                results[workers, streams] = await pipeline_leg(batcher, frames, streams, opts.seconds)
                print(f"  workers {workers}, {streams} streams: {results[workers, streams].fps:.1f} frames/s",
                      flush=True)
        finally:
            await batcher.close()

    header = f"{'streams':>7} {'raw batch':>9} {'raw fps':>8}" + "".join(
        f" | {f'workers {w}: fps':>16} {'÷ raw':>6} {'loop ms/frame':>13}" for w in opts.workers)
    lines = [header]
    for streams in opts.streams:
        lines.append(f"{streams:>7} {min(streams, opts.max_batch):>9} {raw[streams]:>8.1f}" + "".join(
            _cells(results[w, streams], raw[streams]) for w in opts.workers))
    print("\npipeline ÷ raw (same device, same model; loop ms/frame: event-loop thread CPU per analysed frame)")
    for line in lines:
        print(line)
    return lines


def _numbers(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda:0", help="cuda, cuda:N (FP16) or cpu (the dry run)")
    parser.add_argument("--streams", type=_numbers, default=[1, 4, 8, 16], help="comma-separated stream counts")
    parser.add_argument("--workers", type=_numbers, default=[0, 1, 2],
                        help="comma-separated video.detector_workers values (0: in process)")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per leg")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--max-batch", type=int, default=8, help="video.max_batch (the server's default)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="video.max_wait_ms")
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    started = time.perf_counter()
    try:
        asyncio.run(main(opts))
    except ModelNotAvailable as error:  # e.g. --device cuda where there is no CUDA
        raise SystemExit(f"bench.gpu_check: {error}") from None
    print(f"total wall time {time.perf_counter() - started:.1f} s; load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run()
