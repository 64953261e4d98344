"""Test helper: a Milvus-protocol server in a child process, for the memory's server mode (``memory.uri``).

Milvus Standalone ships as a container image, not on PyPI; the registry's ``milvus-lite`` package ships a gRPC
server speaking the Milvus protocol (``python -m milvus_lite server``). pymilvus talks to it exactly as it would
to Milvus Standalone: over gRPC, by URI."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
from tests.support.processes import ChildServer, stop_process


class MilvusServer(ChildServer):
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Self:
        self.port = free_port()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(self.data_dir), "--host", "127.0.0.1",
             "--port", str(self.port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return self
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.stop()
                raise RuntimeError("the Milvus server did not start")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
