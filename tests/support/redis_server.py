"""Test helper: a throw-away ``redis-server`` on a loopback port (no persistence), for Redis-mode tests.
Restartable: ``stop()`` then ``start()`` brings back an empty server on the same port."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
from tests.support.processes import ChildServer, stop_process

REDIS_SERVER = "/usr/bin/redis-server"


class RedisServer(ChildServer):
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> Self:
        if not Path(REDIS_SERVER).is_file():
            raise RuntimeError(f"{REDIS_SERVER} is missing: apt-get install redis-server (scripts/setup.sh)")
        self.port = self.port or free_port()  # a restart keeps the port, so clients can come back
        self._proc = subprocess.Popen(
            [REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            if time.monotonic() > deadline or self._proc.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)
