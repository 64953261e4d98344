"""Debian's Chromium driven by Playwright, a real Vigil server in a child process, and the fake camera/microphone
files Chromium plays (.y4m video from real photographs, .wav speech from Piper). Nothing is downloaded."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.media import write_video
from tests.support.rtsp import free_port
from tests.support.speech_files import wav_bytes

REPO_ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
# DEVELOPERS.md: loopback WebRTC, no network chatter, no sandbox (containers), fake media devices.
CHROMIUM_FLAGS = [
    "--allow-loopback-in-peer-connection",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-device-for-media-stream",
]
GRANT_MEDIA = "--use-fake-ui-for-media-stream"  # answers the permission prompt with "allow"



# ---------------------------------------------------------------- fake media files for Chromium


def write_y4m(path: Path, pictures: list[np.ndarray], fps: int) -> Path:
    """A YUV4MPEG2 (4:2:0) file, the format ``--use-file-for-fake-video-capture`` plays (in a loop)."""
    return write_video(path, pictures, fps, codec="rawvideo", container_format="yuv4mpegpipe", options={})


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> Path:
    """Mono 16-bit WAV, the format ``--use-file-for-fake-audio-capture`` plays."""
    path.write_bytes(wav_bytes(pcm, rate))
    return path


# ---------------------------------------------------------------- a real Vigil server in a child process


class VigilProcess:
    """``vigil serve`` (the real CLI) on a free loopback port, configured by a YAML file."""

    def __init__(self, workdir: Path, config: dict[str, Any], token: str | None = None,
                 root: Path = REPO_ROOT) -> None:
        """``root``: the checkout to serve (benches compare another revision beside this one)."""
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.log_path = workdir / f"vigil-{self.port}.log"
        self.config_path = workdir / f"vigil-{self.port}.yaml"
        # Memory writes under its data_dir and loads torch on first use: only for tests that configure it.
        config = {"memory": {"enabled": False}, **config}
        # JSON is valid YAML; the server reads it like any config file.
        self.config_path.write_text(json.dumps(config))
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> VigilProcess:
        env = {**os.environ, "PYTHONPATH": str(self.root), "YOLO_OFFLINE": "1", "YOLO_AUTOINSTALL": "False"}
        if self.token:
            env["VIGIL_AUTH__TOKEN"] = self.token
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "serve", "--config", str(self.config_path),
                 "--host", "127.0.0.1", "--port", str(self.port)],
                cwd=self.root, env=env, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vigil serve exited with {self.process.returncode}:\n{self.log()}")
            if self.healthy():
                return self
            time.sleep(0.3)
        self.stop()
        raise RuntimeError(f"vigil serve did not answer within {timeout} s:\n{self.log()}")

    def healthy(self) -> bool:
        request = urllib.request.Request(f"{self.url}/healthz")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=2) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def api(self, method: str, path: str, body: Any = None) -> Any:
        request = urllib.request.Request(f"{self.url}{path}", method=method,
                                         data=None if body is None else json.dumps(body).encode())
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read()
            return json.loads(text) if text else None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@contextlib.contextmanager
def running_vigil(workdir: Path, config: dict[str, Any], token: str | None = None) -> Iterator[VigilProcess]:
    server = VigilProcess(workdir, config, token).start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- Chromium


@contextlib.contextmanager
def playwright_driver() -> Iterator[Any]:
    """Playwright's driver (one per thread: a second sync_playwright() inside the first is refused)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        yield playwright


@contextlib.contextmanager
def chromium(playwright: Any, user_data_dir: Path, *, grant_media: bool = True, video_file: Path | None = None,
             audio_file: Path | None = None, loop_audio: bool = False) -> Iterator[Any]:
    """A persistent context of Debian's Chromium with a fresh profile and fake media devices."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install chromium (scripts/setup.sh does); "
                           "Playwright's own browser downloads are never used")
    flags = list(CHROMIUM_FLAGS)
    if grant_media:
        flags.append(GRANT_MEDIA)
    if video_file is not None:
        flags.append(f"--use-file-for-fake-video-capture={video_file}")
    if audio_file is not None:
        flags.append(f"--use-file-for-fake-audio-capture={audio_file}{'' if loop_audio else '%noloop'}")
    context = playwright.chromium.launch_persistent_context(
        str(user_data_dir), executable_path=CHROMIUM, headless=True, args=flags,
        viewport={"width": 1400, "height": 1000},
    )
    try:
        yield context
    finally:
        context.close()
