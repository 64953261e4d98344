"""Test and bench helper: a real OpenAI-compatible LLM server in a child process, and the one readiness wait
(``GET /v1/models`` answers). ``ServedLlm`` is what every served LLM shares (a port picked once and kept across
``stop()``/``start()``, the child in a process group of its own that ``stop()`` ends whole, its log, JSON and
``/metrics`` reads); ``LlmServer`` is llama.cpp's server (via xllamacpp), ``tests/support/vllm_server.py``'s
``VllmServer`` a real vLLM.

``LlmServer`` serves the same GGUF (SmolLM2 unless told) with the same settings as ``EmbeddedLlm``
(``llama_server_params``). Being a separate process, ``stop()`` kills it outright, which is how tests simulate a
backend that goes down.

    with LlmServer() as srv:
        llm = OpenAiLlm(srv.url, srv.model)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn, Self

from models.llm.embedded import smollm2_path
from models.llm.prometheus import parse_prometheus
from tests.support.ports import free_port
from tests.support.processes import ChildServer

REPO = Path(__file__).resolve().parents[2]


async def wait_idle(metrics: Callable[[], dict[str, float]], deadline_s: float = 60.0) -> dict[str, float]:
    """Poll llama.cpp's metrics (``LlmServer.metrics``, ``EmbeddedLlm.backend_metrics``) until no request is in
    flight, and return them (the deadline only guards against a hang)."""
    end = time.monotonic() + deadline_s
    while True:
        found = await asyncio.to_thread(metrics)
        if found["requests_processing"] == 0 or time.monotonic() > end:
            return found
        await asyncio.sleep(0.05)


class ServedLlm(ChildServer):
    """A child process serving the OpenAI API on 127.0.0.1:``port``. Subclasses give ``command()`` (and ``env()``)
    and ``metrics_prefix`` (stripped from metric names; "" keeps them as the server spells them)."""

    kind = "LLM"  # in error messages
    metrics_prefix = ""

    def __init__(self, model_path: str, model: str, *, ready_timeout: float, port: int = 0) -> None:
        self.model_path, self.model, self.ready_timeout = model_path, model, ready_timeout
        self.port = port  # 0: a free one is picked on the first start and kept across stop()/start()
        self.url = ""  # "http://127.0.0.1:PORT", set by start()
        self.started_in_s: float | None = None  # how long the last start took until /v1/models answered
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[str] | None = None

    def command(self) -> Sequence[str]:
        raise NotImplementedError

    def env(self) -> Mapping[str, str]:
        return os.environ

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> Self:
        self.port = self.port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = tempfile.NamedTemporaryFile("w+", prefix="llm-server-", suffix=".log", delete=False)
        started = time.monotonic()
        # stdin: the child's watchdog ends it when this process's end closes (a crashed test run leaves nothing).
        self._proc = subprocess.Popen([*self.command()], cwd=REPO, env=dict(self.env()), stdin=subprocess.PIPE,
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
                time.sleep(0.2)

    def _fail(self, what: str) -> NoReturn:
        log = self.log_tail()
        self.stop()
        raise RuntimeError(f"{self.kind} test server {what}; its log:\n{log}")

    def log_tail(self, chars: int = 4000) -> str:
        if self._log is None:
            return ""
        with open(self._log.name, errors="replace") as log:
            return log.read()[-chars:]

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def post_json(self, path: str, body: Any) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        """The server's own /metrics: {name: value summed over its label sets}, ``metrics_prefix`` stripped."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return parse_prometheus(response.read().decode(), self.metrics_prefix)

    def stop(self, *, hard: bool = False) -> None:
        """End the server's whole process group: SIGTERM (no graceful shutdown asked for, like a crashed backend)
        or, ``hard``, SIGKILL; whatever is left after 30 s is killed."""
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL if hard else signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            with contextlib.suppress(ProcessLookupError):  # whatever of the group is still there
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if proc.stdin is not None:
                proc.stdin.close()
        if self._log is not None:
            self._log.close()
            os.unlink(self._log.name)
            self._log = None


# The child exits when its stdin closes, so it never outlives a crashed test run.
_LLAMA_CPP = """
import sys, xllamacpp
from models.llm.embedded import llama_server_params
params = llama_server_params(sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]))
params.hostnames = ["127.0.0.1"]
params.port = int(sys.argv[4])
server = xllamacpp.Server(params)
sys.stdin.read()
"""


class LlmServer(ServedLlm):
    """llama.cpp's HTTP server (xllamacpp) with ``EmbeddedLlm``'s settings; it serves any model name asked for
    (``model`` is the file's name, its own alias)."""

    kind = "llama.cpp"
    metrics_prefix = "llamacpp:"

    def __init__(
        self, model_path: str | None = None, *, n_ctx: int = 2048, n_threads: int = 2, ready_timeout: float = 60.0,
        port: int = 0,
    ) -> None:
        path = model_path or str(smollm2_path())
        super().__init__(path, Path(path).name, ready_timeout=ready_timeout, port=port)
        self.n_ctx, self.n_threads = n_ctx, n_threads

    def command(self) -> Sequence[str]:
        return [sys.executable, "-c", _LLAMA_CPP, self.model_path, str(self.n_ctx), str(self.n_threads),
                str(self.port)]
