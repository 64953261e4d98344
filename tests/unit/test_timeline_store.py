"""The timeline store on its own: a real SQLite database in a temporary data dir, its writer thread and retention."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client import REGISTRY, generate_latest

from pipelines.timeline.store import ORPHAN_AGE_S, StorageUnavailable, TimelineEntry, TimelineStore


def _entry(wall_ts: float | None = None, **fields) -> TimelineEntry:
    return TimelineEntry(kind="event", name="zone.enter", source="cam", origin="rtsp",
                         wall_ts=time.time() if wall_ts is None else wall_ts, **fields)


@contextmanager
def _opened(tmp_path: Path, **settings) -> Iterator[TimelineStore]:
    store = TimelineStore(tmp_path / "data", **settings)
    store.open()
    try:
        yield store
    finally:
        store.close()


def _wait_for(condition, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


def test_a_full_write_queue_drops_without_blocking_and_counts_it_in_prometheus(tmp_path: Path):
    store = TimelineStore(tmp_path / "data", max_age_s=3600, quota_bytes=10**9, queue_entries=1)
    store.open()
    release, writer_held = threading.Event(), threading.Event()
    try:
        first = _entry()
        assert store.put(first) and store.flush()

        def hold_the_writer(ids: list[str]) -> None:  # the writer thread waits here, as on a slow disk
            writer_held.set()
            release.wait(15)

        store.update_media([first.id], clip_state="failed", on_committed=hold_the_writer)
        assert writer_held.wait(15)
        before = REGISTRY.get_sample_value("vigil_timeline_dropped_total") or 0.0
        failures: list[str] = []
        assert store.put(_entry(), on_failure=failures.append)  # the queue's one place
        started = time.monotonic()
        refused = _entry()
        assert not store.put(refused, on_failure=failures.append)
        assert time.monotonic() - started < 5  # refused at once, never waited for the writer
        assert store.dropped == 1 and failures == ["timeline write queue full: entries are being dropped"]
        assert REGISTRY.get_sample_value("vigil_timeline_dropped_total") == before + 1
        assert b"vigil_timeline_dropped_total" in generate_latest()  # what /metrics serves
    finally:
        release.set()
        store.close()
    assert store.dropped == 1


def test_the_background_timer_enforces_retention_with_nothing_else_asking(tmp_path: Path):
    with _opened(tmp_path, max_age_s=1.0, quota_bytes=10**9, retention_interval_s=0.2) as store:
        entry = _entry()
        (store.root / "clips" / f"{entry.id}.mp4").write_bytes(b"\0" * 100)
        entry.clip = f"clips/{entry.id}.mp4"
        store.put(entry)
        assert store.flush() and store.get(entry.id) is not None  # young: kept by the retention after the commit
        # No write, no request_retention: only the writer's timer can remove it once it is a second old.
        assert _wait_for(lambda: store.get(entry.id) is None)
        assert not (store.root / "clips" / f"{entry.id}.mp4").exists()


def test_retention_removes_media_files_no_entry_names_once_they_are_old(tmp_path: Path):
    with _opened(tmp_path, max_age_s=3600, quota_bytes=10**9) as store:
        named = _entry(clip="clips/named.mp4", snapshot="snapshots/named.jpg")
        store.put(named)
        assert store.flush()
        long_ago = time.time() - ORPHAN_AGE_S - 10
        files = {name: store.root / name for name in (
            "clips/named.mp4", "snapshots/named.jpg",  # old, but an entry names them
            "clips/orphan.mp4", "clips/crashed.mp4.part", "snapshots/orphan.jpg",  # old, named by none
            "clips/in-flight.mp4", "snapshots/in-flight.jpg")}  # named by none yet: their update is still queued
        for name, path in files.items():
            path.write_bytes(b"\0" * 10)
            if "in-flight" not in name:
                os.utime(path, (long_ago, long_ago))
        store.request_retention()
        assert store.flush()
        left = sorted(str(path.relative_to(store.root)) for path in files.values() if path.exists())
        assert left == ["clips/in-flight.mp4", "clips/named.mp4", "snapshots/in-flight.jpg", "snapshots/named.jpg"]
        assert store.get(named.id).clip == "clips/named.mp4"  # type: ignore[union-attr]


def test_entries_sharing_a_snapshot_keep_it_until_the_last_one_goes(tmp_path: Path):
    with _opened(tmp_path, max_age_s=3600, quota_bytes=10**9) as store:
        shared = "snapshots/shared.jpg"
        (store.root / shared).write_bytes(b"\xff\xd8 jpeg")
        now = time.time()
        first, second, third = (_entry(now + index, snapshot=shared) for index in range(3))
        for entry in (first, second, third):
            store.put(entry)
        assert store.flush()
        assert store.delete(first.id) and (store.root / shared).exists()
        store.max_age_s = 0.0
        store.enforce_retention(now=now + 1.5)  # retention by age removes the second ...
        assert store.get(second.id) is None and store.get(third.id) is not None
        assert (store.root / shared).exists()  # ... and the third still names the file
        assert store.delete(third.id) and not (store.root / shared).exists()


def test_close_waits_for_reads_on_other_threads_and_later_reads_are_refused(tmp_path: Path):
    """Memory catches up with the timeline on its own thread; the server closing the store under a running
    query crashed the process (a segfault in CI). Close now waits for the read, and later reads get an error."""
    store = TimelineStore(tmp_path / "data", max_age_s=3600, quota_bytes=10**9)
    store.open()
    for _ in range(200):
        store.put(_entry(text="x" * 200))
    assert store.flush()
    reads, outcome, reading = 0, [], threading.Event()

    def keep_reading() -> None:
        nonlocal reads
        try:
            while True:
                assert len(store.entries_after(0, 200)) == 200
                reads += 1
                reading.set()
        except StorageUnavailable as refused:
            outcome.append(str(refused))

    reader = threading.Thread(target=keep_reading)
    reader.start()
    assert reading.wait(15)
    store.close()
    reader.join(15)
    assert not reader.is_alive() and reads > 0
    assert outcome == ["timeline storage is not open"]
