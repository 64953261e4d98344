"""Test and bench helpers: a free loopback port for a child server, and the wait until that child answers on it
(the one definition of each; import them from here)."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the child binds it later: a small race, fine here)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(proc: subprocess.Popen, port: int, timeout: float, *, interval: float = 0.1,
                  ready: Callable[[socket.socket], bool] = lambda sock: True) -> bool:
    """Whether ``proc`` came to accept connections on 127.0.0.1:``port`` (and ``ready`` says the connected socket
    is served) before ``timeout``; False as soon as it exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                if ready(sock):
                    return True
        except OSError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            return False
        time.sleep(interval)
