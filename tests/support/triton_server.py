"""Test helper: a real NVIDIA Triton Inference Server (the ``tritonserver`` binary from the ``nvidia-pytriton``
wheel) serving a model repository written by ``vigil export-detector``; restartable on the same ports.

It runs in its own venv, ``.venv-triton`` at the repository root (``scripts/setup.sh`` creates it; override with
``VIGIL_TRITON_VENV``), because ``nvidia-pytriton`` pins ``numpy<2``. See ``triton_onnx_server.py`` for how the
ONNX model is served (Triton's Python backend running it with onnxruntime: the wheel ships no onnxruntime backend).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
from tests.support.processes import ChildServer

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVER_SCRIPT = Path(__file__).with_name("triton_onnx_server.py")


def triton_python() -> Path:
    venv = Path(os.environ.get("VIGIL_TRITON_VENV", REPO_ROOT / ".venv-triton"))
    python = venv / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"{python} is missing: scripts/setup.sh creates the Triton venv (nvidia-pytriton, "
                           "onnxruntime) at .venv-triton, or set VIGIL_TRITON_VENV")
    return python


class TritonServer(ChildServer):
    def __init__(self, repository: Path, model: str, *, log_path: Path) -> None:
        self.repository, self.model, self.log_path = repository, model, log_path
        self.grpc_port, self.http_port, self.metrics_port = free_port(), free_port(), free_port()
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def grpc_url(self) -> str:
        return f"grpc://127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 120.0) -> Self:
        log = open(self.log_path, "ab")
        self._proc = subprocess.Popen(
            [str(triton_python()), str(SERVER_SCRIPT), "--repository", str(self.repository), "--model", self.model,
             "--grpc-port", str(self.grpc_port), "--http-port", str(self.http_port),
             "--metrics-port", str(self.metrics_port)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,  # tritonserver is its child: one group
        )
        log.close()
        deadline = time.monotonic() + timeout
        ready_url = f"http://127.0.0.1:{self.http_port}/v2/models/{self.model}/ready"
        while True:
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                self.stop()
                raise RuntimeError(f"Triton did not become ready:\n{tail}")
            time.sleep(0.25)

    def stop(self, *, hard: bool = False) -> None:
        """``hard``: SIGKILL the server and its tritonserver child at once (a crash)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with _suppress_lookup():
            os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with _suppress_lookup():
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # tritonserver may outlive its parent by a moment: make sure the whole group is gone (ports free).
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        with _suppress_lookup():
            os.killpg(proc.pid, signal.SIGKILL)


def _suppress_lookup():  # type: ignore[no-untyped-def]
    import contextlib

    return contextlib.suppress(ProcessLookupError)
