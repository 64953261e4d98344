"""Test helper: run tests/support/rtsp_camera.py (a real gst-rtsp-server) in a subprocess.

The camera needs Debian's GStreamer introspection bindings, which live in the
system interpreter, not the project venv, so it runs as a separate process.

    with RtspCamera(free_port(), audio=True) as cam:
        container = av.open(cam.url, options={"rtsp_transport": "tcp"})
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

from tests.support.ports import free_port

CAMERA_SCRIPT = Path(__file__).with_name("rtsp_camera.py")
SYSTEM_PYTHON = "/usr/bin/python3"


class RtspCamera:
    """A live H.264 (+ optional Opus) RTSP camera; restartable on the same port."""

    def __init__(
        self,
        port: int | None = None,
        *,
        path: str = "/cam",
        width: int = 320,
        height: int = 240,
        fps: int = 15,
        audio: bool = False,
        python: str = SYSTEM_PYTHON,
        ready_timeout: float = 15.0,
    ) -> None:
        self.port = port if port is not None else free_port()
        self.path = path if path.startswith("/") else "/" + path
        self.width, self.height, self.fps, self.audio = width, height, fps, audio
        self.python = python
        self.ready_timeout = ready_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"rtsp://127.0.0.1:{self.port}{self.path}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> None:
        if self.running:
            return
        args = {
            "--port": self.port,
            "--path": self.path,
            "--width": self.width,
            "--height": self.height,
            "--fps": self.fps,
        }
        cmd = [self.python, str(CAMERA_SCRIPT), *(str(x) for kv in args.items() for x in kv)]
        if self.audio:
            cmd.append("--audio")
        # The venv's PYTHONPATH/PYTHONHOME must not leak into the system interpreter.
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        # stderr goes to a file, not a pipe: GStreamer warnings could otherwise
        # fill an undrained pipe and stall the camera mid-test.
        self._stderr = tempfile.TemporaryFile()
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._stderr, env=env
        )
        try:
            self._wait_ready()
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self) -> None:
        proc = self._proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + self.ready_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if not sel.select(left):
                    continue
                line = proc.stdout.readline()
                if not line:  # EOF: the camera died before becoming ready
                    proc.wait(timeout=5)
                    raise RuntimeError(f"RTSP camera exited with {proc.returncode}: {self.error_output()}")
                if line.startswith(b"READY "):
                    return
        raise TimeoutError(f"RTSP camera not ready after {self.ready_timeout}s: {self.error_output()}")

    def error_output(self) -> str:
        """What the camera wrote to stderr so far (GStreamer's warnings; why it died)."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        return self._stderr.read().decode(errors="replace").strip()

    def stop(self, timeout: float = 5.0) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if proc.stdout is not None:
                proc.stdout.close()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
