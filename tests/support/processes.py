"""Test helpers for the child processes tests start (servers on loopback): stopping one, and the context-manager
protocol of a server object (``with RedisServer(...) as server:`` starts it, leaving the block stops it)."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from types import TracebackType
from typing import Any, Self

from tests.support.ports import wait_for_port


def stop_process(proc: subprocess.Popen[Any], timeout: float = 10.0, *, hard: bool = False) -> None:
    """SIGTERM (no graceful shutdown asked for, like a crash), then SIGKILL if it is still there after ``timeout``;
    ``hard``: SIGKILL at once (a process that gets no chance to close anything)."""
    if hard:
        proc.kill()
    else:
        proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ChildServer:
    """Base of the test servers: subclasses implement ``start`` (returns self once ready, the child process in
    ``_proc``); ``stop`` ends that process (a subclass with more to end overrides it)."""

    _proc: subprocess.Popen[bytes] | None = None
    port = 0

    def start(self) -> Self:
        raise NotImplementedError

    def _spawn(self, argv: Sequence[str], what: str, timeout: float, **wait: Any) -> Self:
        """Start ``argv`` (its output discarded) and return once it serves 127.0.0.1:``self.port`` (``wait``:
        ``wait_for_port``'s options); stop it and raise when it does not within ``timeout``."""
        self._proc = subprocess.Popen(list(argv), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not wait_for_port(self._proc, self.port, timeout, **wait):
            self.stop()
            raise RuntimeError(f"{what} did not start")
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_process(proc)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
