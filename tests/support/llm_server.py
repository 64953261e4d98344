"""Test helper: a real OpenAI-compatible LLM server (llama.cpp's, via xllamacpp) in a child process.

It serves the same SmolLM2 GGUF with the same settings as ``EmbeddedLlm`` (``llama_server_params``), on
127.0.0.1 and a port the OS picks (the child prints its address). Being a separate process, ``stop()``
kills it outright, which is how tests simulate a backend that goes down.

    with LlmServer() as srv:
        llm = OpenAiLlm(srv.url, srv.model)
"""

from __future__ import annotations

import json
import selectors
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any, NoReturn, Self

from models.llm.embedded import smollm2_path
from models.llm.prometheus import parse_prometheus
from tests.support.processes import ChildServer, stop_process

REPO = Path(__file__).resolve().parents[2]

# The child exits when its stdin closes, so it never outlives a crashed test run.
_CHILD = """
import sys, xllamacpp
from models.llm.embedded import llama_server_params
params = llama_server_params(sys.argv[1], n_ctx=int(sys.argv[2]), n_threads=int(sys.argv[3]))
params.hostnames = ["127.0.0.1"]
params.port = int(sys.argv[4])
server = xllamacpp.Server(params)
print(server.listening_address, flush=True)
sys.stdin.read()
"""


class LlmServer(ChildServer):
    def __init__(
        self, model_path: str | None = None, *, n_ctx: int = 2048, n_threads: int = 2, ready_timeout: float = 60.0,
        port: int = 0,
    ) -> None:
        self.model_path = model_path or str(smollm2_path())
        self.n_ctx, self.n_threads, self.ready_timeout = n_ctx, n_threads, ready_timeout
        self.url = ""  # "http://127.0.0.1:PORT", set by start()
        self.model = Path(self.model_path).name  # llama.cpp serves any model name; this is its own alias
        self.port = port  # 0: the OS picks one; a restarted server keeps the port it got first
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None

    def start(self) -> Self:
        self._log = tempfile.TemporaryFile("w+")
        args = [sys.executable, "-c", _CHILD, self.model_path, str(self.n_ctx), str(self.n_threads), str(self.port)]
        self._proc = subprocess.Popen(
            args, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True
        )
        deadline = time.monotonic() + self.ready_timeout
        self.url = self._read_address(deadline)
        self.port = int(self.url.rsplit(":", 1)[1])
        while True:  # the child prints after loading, but wait for the HTTP side like a real client would
            try:
                self.get_json("/v1/models")
                return self
            except (OSError, urllib.error.URLError):
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self._fail("did not answer /v1/models")
                time.sleep(0.1)

    def _read_address(self, deadline: float) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(max(0.0, deadline - time.monotonic())):
                self._fail("did not report its address")
        line = self._proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self._fail(f"reported {line!r} instead of its address")
        return line

    def _fail(self, what: str) -> NoReturn:
        log = ""
        if self._log is not None:
            self._log.seek(0)
            log = self._log.read()[-3000:]
        self.stop()
        raise RuntimeError(f"LLM test server {what}; its log:\n{log}")

    def get_json(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as response:
            return json.loads(response.read())

    def post_json(self, path: str, body: Any) -> Any:
        data = json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as response:
            return parse_prometheus(response.read().decode())

    def stop(self, *, hard: bool = False) -> None:
        """Kill the server (SIGTERM: no graceful shutdown, like a crashed backend; ``hard``: SIGKILL)."""
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc, hard=hard)
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()
        if self._log is not None:
            self._log.close()
            self._log = None
