"""The dashboard's search box in Debian's Chromium against ``vigil serve`` whose memory already holds entries."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from models.embeddings import MiniLmEmbedder
from pipelines.memory.entries import MemoryEntry
from pipelines.memory.index import MemoryIndex
from pipelines.memory.lance_vectors import LanceVectors
from tests.integration.test_dashboard import open_dashboard, state, wait_for
from tests.support.browser import chromium, playwright_driver
from tests.support.vigil_process import running_vigil

pytestmark = pytest.mark.timeout(480)
TOKEN = "search-token"


async def _remember(data_dir: Path) -> None:
    index = MemoryIndex(data_dir, MiniLmEmbedder,
                        lambda dim: LanceVectors(data_dir / "vectors.lance", "vigil_memory", dim))
    now = time.time()
    await index.add_now([
        MemoryEntry("transcript", "The red bicycle is locked next to the bakery.", "cam1", "cam1", 4.0, now - 60),
        MemoryEntry("event", "person (track 7) entered zone 'front door'", "cam1", "cam1", 9.5, now - 30,
                    event_id="evt-42", labels=["person"], track_ids=[7]),
        MemoryEntry("scene", "The camera currently sees 2 cars.", "cam2", "cam2", 1.0, now - 10),
    ])
    await index.close()


def test_search_box_lists_results_and_a_result_opens_its_clip(tmp_path: Path):
    data_dir = tmp_path / "memory"
    asyncio.run(_remember(data_dir))
    config = {"memory": {"data_dir": str(data_dir)}, "voice": {"enabled": False},
              "models": {"detector": {"backend": "none"}}}
    with running_vigil(tmp_path, config, token=TOKEN) as server, playwright_driver() as driver, \
            chromium(driver, tmp_path / "profile") as context:
        page = open_dashboard(context, server, token=TOKEN)
        page.fill("#search-input", "where is the bicycle")
        page.click("#search-form button[type=submit]")
        wait_for(page, "s.search.results.length > 0", 180)  # the first search loads MiniLM (torch)
        results = state(page, "window.vigilState.search.results")
        assert "bakery" in results[0]["text"], results
        assert "bakery" in page.locator("#search-results li").first.inner_text()

        page.fill("#search-input", "who came to the front door")
        page.select_option("#search-kind", "event")
        page.click("#search-form button[type=submit]")
        wait_for(page, "s.search.results.length > 0 && s.search.results[0].event_id === 'evt-42'", 60)
        page.locator("#search-results li").first.click()
        selected = state(page, "window.vigilState.search.selected")
        assert selected["shown"] == "clip" and selected["event_id"] == "evt-42", selected
        assert "/api/events/evt-42/clip.mp4" in page.locator("#search-clip").get_attribute("src")

        page.fill("#search-input", "x" * 2000)  # over memory.max_query_chars: the page shows the server's error
        page.click("#search-form button[type=submit]")
        wait_for(page, "s.search.error !== null", 30)
        assert state(page, "window.vigilState.search.error")["code"] == "query_too_long"
