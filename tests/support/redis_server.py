"""Test helper: a throw-away ``redis-server`` on a loopback port (no persistence), for Redis-mode tests.
Restartable: ``stop()`` then ``start()`` brings back an empty server on the same port."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Self

from tests.support.ports import free_port, wait_for_port
from tests.support.processes import ChildServer

REDIS_SERVER = "/usr/bin/redis-server"


class RedisServer(ChildServer):
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = 0

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
        if not wait_for_port(self._proc, self.port, timeout, interval=0.05, ready=_pong):
            self.stop()
            raise RuntimeError("redis-server did not start")
        return self


def _pong(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(16).startswith(b"+PONG")
