"""Debian's Chromium driven by Playwright and the fake camera/microphone files Chromium plays (.y4m video from
real photographs, .wav speech from Piper). Nothing is downloaded."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from tests.support.media import write_video
from tests.support.speech_files import wav_bytes

# The served Vigil moved to tests/support/vigil_process.py; these names stay importable from here for the benches
# that still import them (bench/capacity.py, cameras.py, soak.py).
from tests.support.vigil_process import REPO_ROOT as REPO_ROOT
from tests.support.vigil_process import VigilProcess as VigilProcess
from tests.support.vigil_process import running_vigil as running_vigil

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
