"""Test helper: a throw-away ``redis-server`` on a loopback port (no persistence), for Redis-mode tests.
Restartable: ``stop()`` then ``start()`` brings back an empty server on the same port."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Self

from tests.support.ports import free_port
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
        return self._spawn([REDIS_SERVER, "--bind", "127.0.0.1", "--port", str(self.port), "--save", "",
                            "--appendonly", "no", "--dir", str(self.workdir)], "redis-server", timeout,
                           interval=0.05, ready=_pong)


def _pong(sock: socket.socket) -> bool:
    sock.sendall(b"PING\r\n")
    return sock.recv(16).startswith(b"+PONG")
