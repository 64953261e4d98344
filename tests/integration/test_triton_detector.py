"""The Triton detector backend against a real Triton Inference Server serving what ``vigil export-detector`` wrote.

Triton here is the ``tritonserver`` binary from the ``nvidia-pytriton`` wheel (its Python backend runs the
exported ONNX with onnxruntime: the wheel has no onnxruntime backend), in ``.venv-triton``.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import cv2
import numpy as np
import pytest

from models.detectors import Detection
from models.detectors.triton import (
    DetectorUnavailable,
    TritonDetector,
    TritonDetectorConfig,
    read_repository_metadata,
)
from models.detectors.yolo import UltralyticsDetector
from tests.integration.test_sources import Watcher, _post_source
from tests.support.detections import Tolerance, assert_same_detections
from tests.support.media import real_image, slideshow
from tests.support.triton_server import TritonServer

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository, written by the real CLI command for the default (packaged) weights."""
    root = tmp_path_factory.mktemp("triton-repo")
    done = subprocess.run(
        [sys.executable, "-m", "server.cli", "export-detector", str(root), "--name", "pose", "--cpu",
         "--max-batch", "8"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == str(root / "pose")
    return root


@pytest.fixture(scope="module")
def triton(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    server = TritonServer(repository, "pose", log_path=tmp_path_factory.mktemp("triton-log") / "triton.log")
    with server:
        yield server


def _frames() -> list[np.ndarray]:
    bus = cv2.cvtColor(real_image("bus"), cv2.COLOR_RGB2BGR)
    zidane = cv2.cvtColor(real_image("zidane"), cv2.COLOR_RGB2BGR)
    return [bus, zidane, cv2.resize(bus, (480, 640)), zidane[:, : zidane.shape[1] // 2].copy()]


# Triton runs the ONNX export: its own rounding, so a little looser than the OpenVINO f32 check.
TRITON_TOLERANCE = Tolerance(min_iou=0.85, max_conf=0.08, max_keypoint=0.05, count_slack=1)


def _assert_same(local: list[Detection], remote: list[Detection]) -> int:
    """Returns how many visible keypoints were compared."""
    assert all(d.label == "person" for d in local if d.conf > 0.4)
    return len(assert_same_detections(local, remote, TRITON_TOLERANCE))


def _inference_requests(server: TritonServer) -> tuple[int, int]:
    """(requests, images) Triton has executed for the model, from its Prometheus metrics (PyTriton restricts the
    statistics API)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {}
    for line in text.splitlines():
        for name in ("nv_inference_request_success", "nv_inference_count"):
            if line.startswith(f'{name}{{model="{server.model}"'):
                values[name] = int(float(line.rsplit(" ", 1)[1]))
    return values["nv_inference_request_success"], values["nv_inference_count"]


def _counted_after(server: TritonServer, before: tuple[int, int], timeout_s: float = 10.0) -> tuple[int, int]:
    """The counters once Triton has counted the request: it answers before it counts (the CI suite, on a loaded
    machine, read them unchanged right after the answer), so wait for a change, then for them to settle."""
    deadline = time.monotonic() + timeout_s
    counted = _inference_requests(server)
    while counted == before and time.monotonic() < deadline:
        time.sleep(0.1)
        counted = _inference_requests(server)
    time.sleep(0.5)  # a second request of the same batch, if it was split, would be counted by now
    return _inference_requests(server)


def test_export_writes_a_dynamic_batch_onnx_and_config(repository: Path):
    import onnx

    model_dir = repository / "pose"
    graph = onnx.load(str(model_dir / "1" / "model.onnx"), load_external_data=False).graph
    assert graph.input[0].name == "images"
    assert graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a symbolic (dynamic) batch axis
    config = (model_dir / "config.pbtxt").read_text()
    assert 'name: "pose"' in config and "max_batch_size: 8" in config and "dynamic_batching" in config
    metadata = read_repository_metadata(model_dir)
    assert metadata["task"] == "pose" and metadata["names"] == {0: "person"} and metadata["kpt_shape"] == [17, 3]


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_triton_gives_the_local_detections_in_one_request_per_batch(triton: TritonServer, protocol: str):
    frames = _frames()
    local = UltralyticsDetector().detect(frames)
    url = triton.grpc_url if protocol == "grpc" else triton.http_url
    remote_detector = TritonDetector(TritonDetectorConfig(url=url, model="pose", timeout_s=60))
    assert remote_detector.task == "pose" and remote_detector.names == {0: "person"}  # from the metadata
    requests_before, images_before = _inference_requests(triton)
    remote = remote_detector.detect(frames)
    requests_after, images_after = _counted_after(triton, (requests_before, images_before))
    assert (requests_after - requests_before, images_after - images_before) == (1, len(frames))
    assert len(remote) == len(frames)
    assert sum(_assert_same(want, got) for want, got in zip(local, remote, strict=True)) > 20
    remote_detector.close()


def test_triton_down_fails_fast_with_a_clear_error_and_recovers(repository: Path, tmp_path: Path):
    server = TritonServer(repository, "pose", log_path=tmp_path / "triton.log")
    detector = TritonDetector(TritonDetectorConfig(url=server.grpc_url, model="pose", retry_interval_s=0.2,
                                                   timeout_s=3))  # nothing listens yet: start-up still works
    frame = _frames()[:1]
    with pytest.raises(DetectorUnavailable, match="unavailable"):
        detector.detect(frame)
    with server:
        deadline = 60
        while True:
            try:
                assert detector.detect(frame)[0]
                break
            except DetectorUnavailable:
                deadline -= 1
                assert deadline > 0
                time.sleep(0.5)
    detector.close()


@pytest.fixture
def people_clip(clip_dir: Path) -> str:
    if not (clip_dir / "people.mp4").exists():
        slideshow(clip_dir / "people.mp4", [("bus", 2.0), ("zidane", 2.0)], fps=10)
    return "people.mp4"


async def test_source_survives_a_triton_restart(vigil, triton: TritonServer, people_clip: str):
    """Detections flow through a Triton-backed server; Triton SIGKILLed → one detector_unavailable error on
    the source's results; Triton back on the same ports → detections again, without touching the source."""
    server = await vigil(
        models={"detector": {"backend": "triton",
                             "triton": {"url": triton.grpc_url, "model": "pose", "retry_interval_s": 0.3,
                                        "timeout_s": 3}}},
        video={"target_fps": 5},
    )

    def people(message: dict) -> bool:
        return message["type"] == "detections" and any(o["label"] == "person" for o in message["objects"])

    async with aiohttp.ClientSession() as http:
        source = await _post_source(http, server.url, {"path": people_clip, "loop": True})
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            first = await watcher.next(people, timeout=60)
            assert first["model"] == "pose@triton"
            await asyncio.to_thread(triton.stop, hard=True)
            error = await watcher.next(lambda m: m["type"] == "error", timeout=30)
            assert error["code"] == "detector_unavailable"
            assert "Triton" in error["message"] and triton.grpc_url in error["message"]
            await asyncio.to_thread(triton.start)
            await watcher.next(people, timeout=60)
            errors = [m for m in watcher.seen if m["type"] == "error"]
            assert len(errors) == 1, errors  # once per outage, not once per frame
        async with http.get(f"{server.url}/api/sources/{source['id']}") as response:
            assert (await response.json())["state"] == "live"

