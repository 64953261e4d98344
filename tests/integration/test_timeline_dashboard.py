"""The dashboard's timeline panel in real headless Chromium against a real ``vigil serve`` (YOLO): a person walks
into a zone of a server-side source; the event appears live with its snapshot, and a click plays its clip."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_dashboard import screenshot, state, wait_for
from tests.support.browser import chromium, playwright_driver
from tests.support.media import sliding_person
from tests.support.vigil_process import VigilProcess, running_vigil

pytestmark = pytest.mark.timeout(240)
DOOR = {"name": "door", "polygon": [[0.5, 0.0], [1.0, 0.0], [1.0, 1.0], [0.5, 1.0]]}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("timeline-dashboard")


@pytest.fixture(scope="module")
def server(workdir: Path) -> Iterator[VigilProcess]:
    media = workdir / "media"
    media.mkdir()
    sliding_person(media / "walk.mp4", seconds=6.0, fps=10, options={"preset": "ultrafast", "g": "5"})
    config = {
        "webrtc": {"host_addresses": ["127.0.0.1"]},
        "sources": {"media_root": str(media)},
        "video": {"target_fps": 5},
        "voice": {"enabled": False},
        "storage": {"data_dir": str(workdir / "timeline"), "pre_s": 1.5, "post_s": 1.5},
    }
    with running_vigil(workdir, config) as vigil:
        yield vigil


@pytest.fixture(scope="module")
def browser(workdir: Path) -> Iterator[Any]:
    with playwright_driver() as playwright, chromium(playwright, workdir / "profile") as context:
        yield context


def test_a_stored_event_appears_live_with_its_snapshot_and_plays_its_clip(browser: Any, server: VigilProcess):
    page = browser.new_page()
    page.goto(server.url)
    wait_for(page, "s.ready && s.auth.status === 'ok' && s.timeline.loaded > 0", 30)
    assert state(page, "vigilState.timeline.items") == []
    source = server.api("POST", "/api/sources", {"path": "walk.mp4", "name": "hall", "loop": True,
                                                 "options": {"video": {"zones": [DOOR]}}})
    try:
        page.click("#tab-server")
        page.locator(f"#sources tr[data-source-id='{source['id']}'] button.watch").click()
        # Live: the event message (with its stored id) puts it on the timeline before any poll could.
        wait_for(page, "s.timeline.live > 0 && s.timeline.items.some(i => i.name === 'zone.enter')", 60)
        wait_for(page, "s.timeline.items.some(i => i.name === 'zone.enter' && i.clip_state === 'ready')", 60)
        item = next(i for i in state(page, "vigilState.timeline.items")
                    if i["name"] == "zone.enter" and i["clip_state"] == "ready")
        row = page.locator(f"#timeline li[data-id='{item['id']}']")
        thumbnail = row.locator("img")
        thumbnail.wait_for(timeout=20_000)
        page.wait_for_function("img => img.complete && img.naturalWidth > 0", arg=thumbnail.element_handle(),
                               timeout=20_000)
        assert "entered" in row.text_content() and "door" in row.text_content()

        row.click()  # plays in place
        video = row.locator("video")
        video.wait_for(timeout=10_000)
        page.wait_for_function("v => v.readyState >= 1 && v.duration > 2", arg=video.element_handle(),
                               timeout=30_000)
        assert "/clip.mp4" in video.get_attribute("src")
        assert state(page, "vigilState.timeline.playing") == item["id"]
        screenshot(page, "dashboard-timeline.png")

        page.select_option("#timeline-name", "line.cross")  # a filter with no matches
        wait_for(page, "s.timeline.items.length === 0", 20)
        assert page.locator("#timeline-empty").is_visible()
    finally:
        server.api("DELETE", f"/api/sources/{source['id']}")
        page.close()
