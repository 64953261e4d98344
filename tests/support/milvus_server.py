"""Test helper: a Milvus-protocol server in a child process, for the memory's server mode (``memory.uri``).

Milvus Standalone ships as a container image, not on PyPI; the registry's ``milvus-lite`` package ships a gRPC
server speaking the Milvus protocol (``python -m milvus_lite server``). pymilvus talks to it exactly as it would
to Milvus Standalone: over gRPC, by URI."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
from tests.support.processes import ChildServer


class MilvusServer(ChildServer):
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = 0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> Self:
        self.port = free_port()
        return self._spawn([sys.executable, "-m", "milvus_lite", "server", "--data-dir", str(self.data_dir),
                            "--host", "127.0.0.1", "--port", str(self.port)], "the Milvus server", timeout)
