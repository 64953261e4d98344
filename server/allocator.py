"""The C heap of a long-running server: fewer glibc arenas, and free pages handed back after each session.

glibc gives every thread that contends for the heap an arena of its own, up to 8 per core. A WebRTC session touches
many threads (codecs, ICE, model executors), and what it freed stays in whichever arena served it: ended sessions
left RSS a few tens of KB higher each (`bench/soak.py`). Two measures, both no-ops off glibc:

- ``limit_arenas``: at start-up, before the media threads exist, cap the arenas (``mallopt(M_ARENA_MAX)``, the knob
  behind ``MALLOC_ARENA_MAX``), so freed memory is reused by the next session rather than stranded in another arena.
- ``HeapTrimmer``: after a session ends, ``malloc_trim(0)`` off the event loop returns whole free pages of every
  arena to the OS (glibc >= 2.8 trims inside the heap too, not only its top). Calls are coalesced: at most one
  runs at a time and at most one waits behind it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

M_ARENA_MAX = -8  # glibc's malloc.h


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    # musl and other libcs have no mallopt/malloc_trim: nothing to tune there.
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def limit_arenas(arenas: int) -> bool:
    """Cap glibc's malloc arenas (0 keeps glibc's default). An explicit ``MALLOC_ARENA_MAX`` in the environment
    wins. Call before the server starts its threads; True when the cap was set."""
    if arenas <= 0 or "MALLOC_ARENA_MAX" in os.environ:
        return False
    libc = _libc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_ARENA_MAX, arenas))


class HeapTrimmer:
    """Coalesced ``malloc_trim(0)`` on a short-lived thread of its own, asked for after each ended session (a
    trim walks every arena: milliseconds that must not hold the event loop or an executor a request waits on)."""

    def __init__(self) -> None:
        self._libc = _libc()
        self._lock = threading.Lock()
        self._running = self._again = False
        self.idle = threading.Event()
        self.idle.set()
        self.trims = 0

    @property
    def enabled(self) -> bool:
        return self._libc is not None

    def request(self) -> None:
        """Trim soon; a request while a trim runs makes exactly one more run after it."""
        if self._libc is None:
            return
        with self._lock:
            if self._running:
                self._again = True
                return
            self._running = True
            self.idle.clear()
        threading.Thread(target=self._run, name="heap-trim", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._libc.malloc_trim(0)  # type: ignore[union-attr]  # a C call: it returns, never raises
            self.trims += 1
            with self._lock:
                if not self._again:
                    self._running = False
                    self.idle.set()
                    return
                self._again = False
