"""Video analysis benchmark: pipeline overhead, conversion savings and batching gain, as ratios from one run.

Model: yolo11n-pose (the packaged weights) at each ``--imgsz``. Input: a 30 fps 640x480 H.264 slideshow of real
photos (people, a bus, ...) written on the spot with ``tests.support.media.slideshow``; nothing is downloaded.

* P1, pipeline overhead: analysed frames/s through N ``SessionPipeline``s (wall clock, their own workers,
  ``DetectorVideoAnalyzer`` with motion gating off over one shared ``InferenceBatcher`` with ``--max-batch``/
  ``--max-wait-ms``, the server defaults) ÷ ``detector.detect`` in a tight loop on the same frames pre-converted
  to BGR (batches of 1 for one stream, of 4 for four). Goal >= 0.9.
  Feeding: each stream is handed its next decoded ``av.VideoFrame`` the moment its worker takes the previous one
  from the latest-frame slot, so the slot always holds work (as with a camera faster than the analysis) yet no
  CPU is spent on frames that would only be dropped; ``target_fps`` is 120, so sampling never skips a frame.
* P2, CPU per stream: process CPU seconds (all threads) to replay the 30 fps file sampled at 5 fps with a
  ``VirtualClock`` through ``ContainerSource`` (decoding included), Vigil (only sampled frames are converted,
  inside the batcher) ÷ a naive variant that converts every decoded frame to BGR before sampling and hands the
  sampled arrays to the same analyser, batcher and detector. Both analyse the same frames; they run V-N-N-V,
  pooled. Goal <= 0.5. Two more rows (decoding alone, decoding + converting every frame) show where CPU goes.
* P3, batching gain: throughput of 8 streams with ``max_batch=8`` ÷ the same 8 streams with ``max_batch=1``.
  Goal >= 1.25 (this CPU).

Throughput is counted between detector-call boundaries: frames in the calls that end after a leg's first call
(the first call of every leg is warm-up), over the time from the end of that first call to the end of the last;
so a batch is never half counted, and every gap the pipeline leaves between calls is in the time. Each pair of
setups runs A-B-B-A (half of ``--seconds`` per leg) to spread drift; the ratios are the point, not the fps.

Run (about 3 minutes on 2 CPU cores with the defaults)::

    cd /work/main && .venv/bin/python -m bench.video
    cd /work/main && .venv/bin/python -m bench.video --device cuda --seconds 6   # a GPU host (fp16)
"""

from __future__ import annotations

import os

os.environ.setdefault("YOLO_OFFLINE", "1")  # before anything imports ultralytics

import argparse
import asyncio
import contextlib
import itertools
import logging
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import av
import numpy as np

from models.detectors import Detection, Detector, load_detector
from models.detectors.yolo import YoloConfig
from models.packaged import ModelNotAvailable
from pipelines.clock import VirtualClock, WallClock
from pipelines.ports import DetectionResult, SampledFrame
from pipelines.protocol import MotionConfig, SessionConfig, VideoSessionConfig
from pipelines.session import SessionPipeline
from pipelines.sources.container import ContainerSource, SourceState
from pipelines.video.analyzer import DetectorVideoAnalyzer
from pipelines.video.batcher import FrameDetector, InferenceBatcher, to_bgr
from tests.support.media import slideshow

FPS = 30
SIZE = (640, 480)
SAMPLED_FPS = 5.0  # P2's target rate
UNSAMPLED_FPS = 120.0  # P1/P3: above the feed rate, so every fed frame is due
# Every frame the pipeline is fed goes to the detector: these legs measure what the pipeline adds per detector call
# and per converted frame; motion gating (on by default: a slideshow is mostly still) is the cameras bench's subject.
UNGATED = MotionConfig(enabled=False)


def _discard(message: Any) -> None:
    return None


# ---------------------------------------------------------------------------- measuring


@dataclass(slots=True)
class Rate:
    frames: int = 0
    seconds: float = 0.0
    calls: int = 0
    analyzed: int = 0  # the pipelines' own frames_analyzed (a cross-check; 0 for raw legs)

    def __add__(self, other: Rate) -> Rate:
        return Rate(self.frames + other.frames, self.seconds + other.seconds, self.calls + other.calls,
                    self.analyzed + other.analyzed)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds else float("nan")


class TimedDetector:
    """Wraps the detector, recording the end time and size of every call (the batch boundaries)."""

    def __init__(self, inner: Detector) -> None:
        self.inner, self.name, self.device = inner, inner.name, inner.device
        self.calls: list[tuple[float, int]] = []
        self.first = threading.Event()  # the first call ended
        self.idle = threading.Event()  # no call in progress
        self.idle.set()

    def detect(self, images: list[np.ndarray]) -> list[list[Detection]]:
        self.idle.clear()
        try:
            return self.inner.detect(images)
        finally:
            self.calls.append((time.perf_counter(), len(images)))
            self.first.set()
            self.idle.set()

    def rate(self, until: float = float("inf")) -> Rate:
        calls = [c for c in self.calls if c[0] <= until]
        if len(calls) < 2:
            return Rate()
        return Rate(sum(n for _, n in calls[1:]), calls[-1][0] - calls[0][0], len(calls) - 1)


def raw_leg(detector: Detector, images: list[np.ndarray], batch: int, seconds: float) -> Rate:
    timed = TimedDetector(detector)
    index = 0
    while len(timed.calls) < 1 or time.perf_counter() < timed.calls[0][0] + seconds:
        timed.detect([images[(index + j) % len(images)] for j in range(batch)])
        index += batch
    return timed.rate()


class RefillingAnalyzer:
    """``DetectorVideoAnalyzer`` plus a signal to the feeder: the worker took a frame, so refill the slot."""

    def __init__(self, inner: DetectorVideoAnalyzer, taken: asyncio.Event) -> None:
        self.inner, self.name, self.taken = inner, inner.name, taken

    def configure(self, config: VideoSessionConfig) -> None:
        self.inner.configure(config)

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        self.taken.set()
        return await self.inner.analyze(sampled)


async def _feed(pipeline: SessionPipeline, frames: list[av.VideoFrame], offset: int, taken: asyncio.Event) -> None:
    for index in itertools.count():
        frame = frames[(offset + index) % len(frames)]
        assert frame.time_base is not None
        frame.pts = round(Fraction(index, FPS) / frame.time_base)  # read at once by feed_video: sharing is safe
        taken.clear()
        await pipeline.feed_video(frame)
        await taken.wait()


def fed_pipelines(batcher: FrameDetector, frames: list[av.VideoFrame], streams: int,
                  name: str) -> tuple[list[SessionPipeline], list[asyncio.Task[None]]]:
    """``streams`` ungated, unsampled session pipelines on ``batcher``, each fed the next frame as soon as it took
    the last (so the detector, never the feeding, is the limit); the streams start at spread-out frames."""
    config = SessionConfig(video=VideoSessionConfig(target_fps=UNSAMPLED_FPS, motion=UNGATED))
    pipelines: list[SessionPipeline] = []
    feeders: list[asyncio.Task[None]] = []
    for k in range(streams):
        taken = asyncio.Event()
        pipeline = SessionPipeline(f"{name}-{k}", origin="bench", clock=WallClock(), emit=_discard, config=config,
                                   server_version="bench",
                                   video_analyzer=RefillingAnalyzer(DetectorVideoAnalyzer(batcher), taken))
        pipeline.start()
        pipelines.append(pipeline)
        feeders.append(asyncio.create_task(_feed(pipeline, frames, k * len(frames) // streams, taken)))
    return pipelines, feeders


async def stop_fed(pipelines: list[SessionPipeline], feeders: list[asyncio.Task[None]]) -> None:
    for task in feeders:
        task.cancel()
    await asyncio.gather(*feeders, return_exceptions=True)
    for pipeline in pipelines:
        await pipeline.close()


async def pipeline_leg(detector: Detector, frames: list[av.VideoFrame], streams: int, max_batch: int,
                       max_wait_ms: float, seconds: float) -> Rate:
    timed = TimedDetector(detector)
    batcher = InferenceBatcher(timed, max_batch=max_batch, max_wait_ms=max_wait_ms)
    pipelines, feeders = fed_pipelines(batcher, frames, streams, "bench")
    try:
        await asyncio.to_thread(timed.first.wait)
        until = timed.calls[0][0] + seconds
        await asyncio.sleep(until - time.perf_counter())
        rate = timed.rate(until)
        rate.analyzed = sum(p.counts.video.frames_analyzed for p in pipelines)
    finally:
        await stop_fed(pipelines, feeders)
        await batcher.close()
        await asyncio.to_thread(timed.idle.wait)  # the executor may still finish a batch: keep it out of the next leg
    return rate


@dataclass(slots=True)
class Pair:
    """Two setups measured A-B-B-A; ``ratio`` is A's throughput ÷ B's, pooled over both rounds."""

    a: list[Rate]
    b: list[Rate]

    @property
    def pooled(self) -> tuple[Rate, Rate]:
        return sum(self.a, Rate()), sum(self.b, Rate())

    @property
    def ratio(self) -> float:
        a, b = self.pooled
        return a.fps / b.fps

    def spread(self) -> str:
        """The ratio in each round on its own: how far apart they are shows how noisy the machine was."""
        return ", ".join(f"{a.fps / b.fps:.2f}" for a, b in zip(self.a, self.b, strict=True))


async def abba(a: Callable[[float], Awaitable[Rate]], b: Callable[[float], Awaitable[Rate]], seconds: float) -> Pair:
    """A-B-B-A with half the time per leg, so a drift in machine speed does not favour either side."""
    ra1, rb1 = await a(seconds / 2), await b(seconds / 2)
    rb2, ra2 = await b(seconds / 2), await a(seconds / 2)
    return Pair([ra1, ra2], [rb1, rb2])


# ---------------------------------------------------------------------------- P2: CPU per stream


class Converted:
    """A decoded frame the naive variant already converted: the batcher's ``to_bgr`` gets the array back as is."""

    format = SimpleNamespace(name="bgr24")  # what pipelines.video.frames.to_array reads: no conversion needed

    def __init__(self, image: np.ndarray) -> None:
        self.image = image
        self.height, self.width = image.shape[:2]

    def to_ndarray(self) -> np.ndarray:
        return self.image


class PreconvertedAnalyzer:
    """The naive variant's analyser: Vigil's own analyser (same batcher, tracker, messages), handed the frame its
    feeder converted, so the two variants differ only in which frames get converted."""

    def __init__(self, inner: DetectorVideoAnalyzer) -> None:
        self.inner, self.name = inner, inner.name
        self.current: Converted | None = None

    def configure(self, config: VideoSessionConfig) -> None:
        self.inner.configure(config)

    async def analyze(self, sampled: SampledFrame) -> DetectionResult:
        assert self.current is not None
        frame = cast(av.VideoFrame, self.current)
        return await self.inner.analyze(SampledFrame(frame, sampled.pts, sampled.sampled_at))


class ConvertEveryFrame:
    """What ContainerSource feeds in the naive variant: every decoded frame is converted before sampling."""

    def __init__(self, pipeline: SessionPipeline, analyzer: PreconvertedAnalyzer | None) -> None:
        self.pipeline, self.analyzer = pipeline, analyzer

    def add_track(self, kind: str) -> None:
        self.pipeline.add_track(kind)

    async def feed_video(self, frame: av.VideoFrame) -> None:
        converted = Converted(frame.to_ndarray(format="bgr24"))
        if self.analyzer is not None:
            self.analyzer.current = converted
        await self.pipeline.feed_video(frame)

    async def feed_audio(self, frame: av.AudioFrame) -> None:
        await self.pipeline.feed_audio(frame)


@dataclass(slots=True)
class CpuRun:
    name: str
    cpu_s: float
    wall_s: float
    frames_in: int
    analyzed: int

    def __add__(self, other: CpuRun) -> CpuRun:
        return CpuRun(self.name, self.cpu_s + other.cpu_s, self.wall_s + other.wall_s,
                      self.frames_in + other.frames_in, self.analyzed + other.analyzed)


async def cpu_run(name: str, path: Path, detector: Detector | None, *, naive: bool, max_batch: int,
                  max_wait_ms: float) -> CpuRun:
    batcher = InferenceBatcher(detector, max_batch=max_batch, max_wait_ms=max_wait_ms) if detector else None
    analyzer: DetectorVideoAnalyzer | PreconvertedAnalyzer | None = None
    if batcher is not None:
        analyzer = DetectorVideoAnalyzer(batcher)
        if naive:
            analyzer = PreconvertedAnalyzer(analyzer)
    pipeline = SessionPipeline(name, origin="bench", clock=VirtualClock(), emit=_discard, server_version="bench",
                               config=SessionConfig(video=VideoSessionConfig(target_fps=SAMPLED_FPS, motion=UNGATED)),
                               video_analyzer=analyzer)
    target = ConvertEveryFrame(pipeline, cast(PreconvertedAnalyzer | None, analyzer)) if naive else pipeline
    source = ContainerSource(str(path), cast(SessionPipeline, target), kind="file", realtime=False)
    cpu, wall = time.process_time(), time.perf_counter()
    pipeline.start()
    await source.start()
    await pipeline.close()
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if batcher is not None:
        await batcher.close()
    if source.state != SourceState.ENDED:
        raise RuntimeError(f"{name}: source ended in state {source.state} {source.state_detail}")
    return CpuRun(name, cpu, wall, pipeline.counts.video.frames_in, pipeline.counts.video.frames_analyzed)


# ---------------------------------------------------------------------------- report


def _verdict(ratio: float, goal: float, at_least: bool) -> str:
    met = ratio >= goal if at_least else ratio <= goal
    return f"(goal {'>=' if at_least else '<='} {goal:g}: {'met' if met else 'NOT met'})"


def _row(name: str, streams: int, batch: str, rate: Rate) -> str:
    analyzed = str(rate.analyzed) if rate.analyzed else "-"
    mean = f"{rate.frames / rate.calls:.2f}" if rate.calls else "-"
    return (f"  {name:<26}{streams:>8}{batch:>7}{rate.calls:>7}{mean:>7}{rate.frames:>8}{analyzed:>10}"
            f"{rate.seconds:>9.2f}{rate.fps:>9.2f}")


async def bench_imgsz(imgsz: int, opts: argparse.Namespace, clip: Path, frames: list[av.VideoFrame],
                      images: list[np.ndarray]) -> list[str]:
    import torch

    detector = load_detector(YoloConfig(imgsz=imgsz, device=opts.device, half=opts.device.startswith("cuda")))
    mb, wait, seconds = opts.max_batch, opts.max_wait_ms, opts.seconds

    def raw(batch: int) -> Callable[[float], Awaitable[Rate]]:
        async def leg(s: float) -> Rate:
            return raw_leg(detector, images, batch, s)
        return leg

    def pipe(streams: int, max_batch: int) -> Callable[[float], Awaitable[Rate]]:
        return lambda s: pipeline_leg(detector, frames, streams, max_batch, wait, s)

    p1 = {streams: await abba(pipe(streams, mb), raw(streams), seconds) for streams in (1, 4)}
    p3 = await abba(pipe(8, mb), pipe(8, 1), seconds)
    ref = await abba(raw(8), raw(1), seconds / 2)  # the model's own batching gain, for reading P3
    def cpu(name: str, with_detector: bool, naive: bool) -> Awaitable[CpuRun]:
        return cpu_run(name, clip, detector if with_detector else None, naive=naive, max_batch=mb, max_wait_ms=wait)

    decode, convert_all = await cpu("decode only", False, False), await cpu("decode + convert all", False, True)
    vigil_runs = [await cpu("vigil (2 runs)", True, False)]  # vigil, naive, naive, vigil: CPU time drifts too
    naive_runs = [await cpu("naive, convert all (2 runs)", True, True) for _ in range(2)]
    vigil_runs.append(await cpu("vigil (2 runs)", True, False))
    vigil, naive = sum(vigil_runs[1:], vigil_runs[0]), sum(naive_runs[1:], naive_runs[0])
    runs = [decode, convert_all, vigil, naive]

    print(f"\nimgsz={imgsz}: {detector.name} on {opts.device}, torch threads {torch.get_num_threads()}, "
          f"max_batch={mb} max_wait_ms={wait:g}")
    print(f"  {'throughput (wall clock)':<26}{'streams':>8}{'batch':>7}{'calls':>7}{'mean':>7}{'frames':>8}"
          f"{'analysed':>10}{'seconds':>9}{'fps':>9}")
    rows = [("P1 pipeline", 1, f"<={mb}", p1[1].pooled[0]), ("P1 raw detect", 1, "1", p1[1].pooled[1]),
            ("P1 pipeline", 4, f"<={mb}", p1[4].pooled[0]), ("P1 raw detect", 4, "4", p1[4].pooled[1]),
            ("P3 pipeline batched", 8, f"<={mb}", p3.pooled[0]), ("P3 pipeline batching off", 8, "1", p3.pooled[1]),
            ("(ref) raw detect", 8, "8", ref.pooled[0]), ("(ref) raw detect", 1, "1", ref.pooled[1])]
    for row in rows:
        print(_row(*row))
    clip_s = decode.frames_in / FPS
    print(f"  {f'P2 CPU, 1 stream, {FPS}->{SAMPLED_FPS:g} fps':<30}{'frames':>8}{'analysed':>10}"
          f"{'cpu s':>9}{'wall s':>9}{'cpu s/media s':>15}{'cpu ms/frame in':>17}")
    for r in runs:
        media_s = r.frames_in / FPS
        print(f"  {r.name:<30}{r.frames_in:>8}{r.analyzed:>10}{r.cpu_s:>9.2f}{r.wall_s:>9.2f}"
              f"{r.cpu_s / media_s:>15.3f}{1000 * r.cpu_s / r.frames_in:>17.2f}")

    lines = []
    for streams, pair in p1.items():
        pipeline, raw_rate = pair.pooled
        per_call = 1000 * (pipeline.seconds / pipeline.calls - raw_rate.seconds / raw_rate.calls)
        lines.append(f"P1 imgsz={imgsz} streams={streams}: pipeline {pipeline.fps:.2f} fps / raw {raw_rate.fps:.2f} fps"
                     f" = {pair.ratio:.2f} {_verdict(pair.ratio, 0.9, True)}  [rounds {pair.spread()}; pipeline "
                     f"{per_call:+.1f} ms per detector call]")
    ratio = vigil.cpu_s / naive.cpu_s
    rounds = ", ".join(f"{v.cpu_s / n.cpu_s:.2f}" for v, n in zip(vigil_runs, naive_runs[::-1], strict=True))
    lines.append(f"P2 imgsz={imgsz}: vigil {vigil.cpu_s / 2:.2f} cpu s / naive {naive.cpu_s / 2:.2f} cpu s per stream "
                 f"({clip_s:g} s at {FPS} fps, {decode.analyzed} analysed, mean of 2 runs) = {ratio:.2f} "
                 f"{_verdict(ratio, 0.5, False)}  [rounds {rounds}]")
    convert_s = (convert_all.cpu_s - decode.cpu_s) / convert_all.frames_in  # one conversion, derived
    detect_s = (vigil.cpu_s / 2 - decode.cpu_s) / decode.analyzed - convert_s
    before = (decode.cpu_s + decode.analyzed * convert_s) / convert_all.cpu_s
    lines.append(f"   (detector excluded, derived: decode + {decode.analyzed} conversions / decode + "
                 f"{convert_all.frames_in} conversions = {before:.2f}; one conversion {1000 * convert_s:.2f} ms cpu, "
                 f"detection + analysis {1000 * detect_s:.1f} ms cpu per analysed frame)")
    on, off = p3.pooled
    lines.append(f"P3 imgsz={imgsz} streams=8: batched {on.fps:.2f} fps / batching off {off.fps:.2f} fps = "
                 f"{p3.ratio:.2f} {_verdict(p3.ratio, 1.25, True)}  [rounds {p3.spread()}; raw batch 8 / "
                 f"raw batch 1 = {ref.ratio:.2f}]")
    for line in lines:
        print(line, flush=True)
    return lines


class _CountDeprecations(logging.Filter):
    """ultralytics 8.4 logs "'half' is deprecated" on every predict call given half=...: count, don't print."""

    count = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if "is deprecated" in record.getMessage():
            self.count += 1
            return False
        return True


async def main(opts: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="vigil-bench-") as tmp:
        third = opts.seconds / 3
        clip = slideshow(Path(tmp) / "clip.mp4", [("bus", third), ("zidane", third), ("astronaut", third)],
                         fps=FPS, size=SIZE)
        with av.open(str(clip)) as container:
            frames = list(container.decode(video=0))
        images = [to_bgr(frame) for frame in frames]
        print(f"load average before {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores (other work adds noise)")
        print(f"clip: {len(frames)} frames, {SIZE[0]}x{SIZE[1]} @ {FPS} fps; {opts.seconds:g} s measured per setup "
              "(A-B-B-A legs of half that); fps counted between detector-call boundaries", flush=True)
        summary = [line for imgsz in opts.imgsz for line in await bench_imgsz(imgsz, opts, clip, frames, images)]
    print("\nsummary")
    for line in summary:
        print(line)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--imgsz", type=int, nargs="+", default=[320, 640])
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="measured seconds per setup (split over its two legs); also the P2 clip's length")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (CUDA runs fp16)")
    parser.add_argument("--max-batch", type=int, default=8, help="the batcher's max_batch (P1, P3 batched)")
    parser.add_argument("--max-wait-ms", type=float, default=10.0, help="the batcher's max_wait_ms")
    return parser.parse_args(argv)


def run(argv: list[str] | None = None) -> None:
    opts = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from ultralytics.utils import LOGGER  # after YOLO_OFFLINE is set

    deprecations = _CountDeprecations()
    LOGGER.addFilter(deprecations)
    started = time.perf_counter()
    try:
        asyncio.run(main(opts))
    except ModelNotAvailable as error:  # e.g. --device cuda where there is no CUDA
        raise SystemExit(f"bench.video: {error}") from None
    print(f"total wall time {time.perf_counter() - started:.1f} s; load average after {os.getloadavg()[0]:.2f} "
          f"(this bench included); ultralytics deprecation warnings suppressed: {deprecations.count}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        run()
