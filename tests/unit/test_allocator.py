"""The C-heap upkeep of a long-running server: arenas capped at start-up, trims coalesced."""

from __future__ import annotations

import threading

import pytest

from server import allocator
from server.allocator import HeapTrimmer, limit_arenas

pytestmark = pytest.mark.skipif(allocator._libc() is None, reason="not glibc: nothing to tune")


def test_an_explicit_environment_setting_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_arenas(2) is False


def test_zero_keeps_glibcs_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert limit_arenas(0) is False


def test_requests_while_a_trim_runs_make_exactly_one_more() -> None:
    trimmer = HeapTrimmer()
    assert trimmer.enabled
    started, release = threading.Event(), threading.Event()
    calls: list[int] = []
    real_libc = trimmer._libc

    class HeldBackTrimLibc:  # a named seam: the real malloc_trim, held until the test lets it run
        def malloc_trim(self, pad: int) -> int:
            calls.append(pad)
            started.set()
            assert release.wait(5)
            return real_libc.malloc_trim(pad)

    trimmer._libc = HeldBackTrimLibc()  # type: ignore[assignment]
    trimmer.request()
    assert started.wait(5)
    for _ in range(5):  # all while the first trim runs: they coalesce into one more
        trimmer.request()
    release.set()
    assert trimmer.idle.wait(5)
    assert trimmer.trims == 2 and calls == [0, 0]
    trimmer.request()  # idle again: a new request trims once more
    assert trimmer.idle.wait(5) and trimmer.trims == 3
