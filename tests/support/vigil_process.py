"""Test and bench helper: ``vigil serve`` (the real CLI) in a child process on a free loopback port, and the one
wait for it to be ready (``/healthz`` answers 200). Every test and bench that starts a server process uses it."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.ports import free_port
from tests.support.processes import stop_process

REPO_ROOT = Path(__file__).resolve().parents[2]


# The config sections that keep a user's data, by default under the checkout's data/ (relative to the cwd, which is
# the served checkout): the timeline (and faces), memory, transcription jobs.
DATA_SECTIONS = ("storage", "memory", "transcription")


def with_data_dirs(config: dict[str, Any], folder: Path) -> dict[str, Any]:
    """``config`` with ``data_dir`` set to a folder of ``folder`` in each of ``DATA_SECTIONS`` that does not set
    its own (tests and benches wrote the user's timeline)."""
    config = dict(config)
    for section in DATA_SECTIONS:
        values = dict(config.get(section) or {})
        values.setdefault("data_dir", str(folder / section))
        config[section] = values
    return config


class VigilProcess:
    """``python -m server.cli serve`` from ``root`` (cwd and PYTHONPATH: benches serve another checkout beside
    this one), on a free port of 127.0.0.1, its output in ``log_path``.

    The server's settings: ``config`` (written to a file; memory is off unless ``memory_off=False`` or the config
    turns it on, since it loads torch on first use; every data directory the config does not name is a folder of
    ``workdir``, never the served checkout's ``data/``: ``with_data_dirs``), or ``config_file`` as given (a test of
    the config file itself, which names its own data directories),
    then ``env`` and ``args`` (extra command-line flags). ``token``: the bearer token clients send; with ``config``
    it is also the server's (``VIGIL_AUTH__TOKEN``), with ``config_file`` the file must set it."""

    def __init__(self, workdir: Path, config: dict[str, Any] | None = None, token: str | None = None,
                 root: Path = REPO_ROOT, *, config_file: Path | None = None, args: Sequence[str] = (),
                 env: Mapping[str, str] | None = None, memory_off: bool = True, log_path: Path | None = None) -> None:
        if config is not None and config_file is not None:
            raise ValueError("pass config or config_file, not both")
        self.root = root
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = token
        self.args = list(args)
        self.log_path = log_path or workdir / f"vigil-{self.port}.log"
        self.env = {**os.environ, "PYTHONPATH": str(root), "PYTHONUNBUFFERED": "1", "YOLO_OFFLINE": "1",
                    "YOLO_AUTOINSTALL": "False"}
        if config_file is None:
            config = {"memory": {"enabled": False}, **(config or {})} if memory_off else dict(config or {})
            config = with_data_dirs(config, workdir / f"vigil-{self.port}-data")
            config_file = workdir / f"vigil-{self.port}.yaml"
            config_file.write_text(json.dumps(config))  # JSON is valid YAML; the server reads it like any config
            if token:
                self.env["VIGIL_AUTH__TOKEN"] = token
        self.config_path = config_file
        self.env.update(env or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 180.0) -> VigilProcess:
        """Start the server and return once it answers (blocking: from async code, ``asyncio.to_thread``)."""
        with open(self.log_path, "wb") as log:  # the child keeps its own descriptor
            self.process = subprocess.Popen(
                [sys.executable, "-m", "server.cli", "serve", "--config", str(self.config_path),
                 "--host", "127.0.0.1", "--port", str(self.port), *self.args],
                cwd=self.root, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if self.process.poll() is not None:
                raise RuntimeError(f"vigil serve from {self.root} exited with {self.process.returncode}:\n"
                                   f"{self.log()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"vigil serve from {self.root} did not answer within {timeout} s:\n{self.log()}")
            time.sleep(0.2)
        return self

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

    def log(self, tail: int = 5000) -> str:
        """The last ``tail`` characters of the server's output (all of it with ``tail=0``)."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return text[-tail:] if tail else text

    def stop(self, timeout: float = 30.0, *, hard: bool = False) -> int | None:
        """SIGTERM (a graceful stop), SIGKILL after ``timeout``; ``hard``: SIGKILL at once (no shutdown handler
        runs). Returns the exit status (None if never started)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            stop_process(self.process, timeout, hard=hard)
        return self.process.returncode


@contextlib.contextmanager
def running_vigil(workdir: Path, config: dict[str, Any], token: str | None = None) -> Iterator[VigilProcess]:
    server = VigilProcess(workdir, config, token).start()
    try:
        yield server
    finally:
        server.stop()
