"""The checkout's own data directory (``data/``, where ``vigil serve`` keeps a user's timeline, memory, faces and
transcription jobs by default) must come out of a test run as it went in: tests and benches write only to
temporary directories (a whole ``make test`` once left 110 timeline entries, clips and snapshots there,
which ``make run``'s dashboard then showed). ``data/models`` is set-up's (installed models), not the user's data.

``tests/conftest.py`` takes a ``snapshot`` when the session starts and compares it at the end (``changes``)."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
NOT_USER_DATA = frozenset({"models"})  # written by scripts/setup.sh

Snapshot = dict[str, tuple[int, int] | None]  # relative path -> (size, mtime_ns) of a file; None for a folder


def snapshot(data_dir: Path = DATA_DIR, skip: frozenset[str] = NOT_USER_DATA) -> Snapshot:
    """Every folder and file under ``data_dir`` (none if it does not exist), but the top-level ``skip`` ones."""
    found: Snapshot = {}
    if not data_dir.is_dir():
        return found
    for root, folders, files in os.walk(data_dir):
        here = Path(root)
        if here == data_dir:
            folders[:] = [f for f in folders if f not in skip]
            files = [f for f in files if f not in skip]
        for name in folders:
            found[str((here / name).relative_to(data_dir))] = None
        for name in files:
            path = here / name
            try:
                stat = path.lstat()
            except FileNotFoundError:  # removed while walking
                continue
            found[str(path.relative_to(data_dir))] = (stat.st_size, stat.st_mtime_ns)
    return found


def changes(before: Snapshot, after: Snapshot) -> list[str]:
    """What differs, one line each: ``+ path`` (new), ``- path`` (gone), ``~ path`` (written)."""
    lines = [f"+ {path}" for path in sorted(after.keys() - before.keys())]
    lines += [f"- {path}" for path in sorted(before.keys() - after.keys())]
    lines += [f"~ {path}" for path in sorted(before.keys() & after.keys()) if before[path] != after[path]]
    return lines
