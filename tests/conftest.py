"""What every test session shares: the checkout's data directory is never written (tests/support/data_guard.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.data_guard import DATA_DIR, changes, snapshot


@pytest.fixture(scope="session", autouse=True)
def user_data_untouched() -> Iterator[None]:
    """Fails the run (an error at the last test's teardown) when any test wrote under ``data/`` outside
    ``data/models``: give the server a temporary ``storage.data_dir`` (and ``memory.data_dir``,
    ``transcription.data_dir``), as the ``vigil`` fixture and ``VigilProcess`` do."""
    before = snapshot()
    yield
    changed = changes(before, snapshot())
    assert not changed, (f"the test run wrote into the checkout's data directory {DATA_DIR} (the user's timeline, "
                         "memory, faces or jobs): use a temporary directory\n" + "\n".join(changed[:50]))
