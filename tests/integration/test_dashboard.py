"""The dashboard in real headless Chromium (Debian's, driven by Playwright) against a real ``vigil serve``.

Chromium's fake camera plays a .y4m made from a real photograph with people (Ultralytics' bus.jpg) and its fake
microphone a Piper-synthesised question, so the real detector, tracker, Whisper, SmolLM2 and Piper all run.
Assertions read what the page exposes (``window.vigilState``, ``data-*`` on the overlay canvas, the DOM), plus
a few canvas pixels. Screenshots go to ``artifacts/`` (git-ignored).
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from pipelines.voice.audio import OUT_RATE
from tests.support import face_photos
from tests.support.audio import silence, speech
from tests.support.browser import chromium, playwright_driver, write_wav, write_y4m
from tests.support.media import letterbox, real_image, slideshow
from tests.support.vigil_process import REPO_ROOT, VigilProcess, running_vigil

TOKEN = "dashboard-test-token"
QUESTION = "How many people do you see?"
LONG_REQUEST = "Tell me a long story about a red bus and the people in the city."
INTERRUPTION = "Stop. Wait a moment please."
ARTIFACTS = REPO_ROOT / "artifacts"
DOOR = {"name": "door", "polygon": [[0.0, 0.3], [0.45, 0.3], [0.45, 1.0], [0.0, 1.0]]}

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("dashboard")


@pytest.fixture(scope="module")
def fake_camera(workdir: Path) -> Path:
    """bus.jpg (four people) as a looping 640x480 camera."""
    picture = letterbox(real_image("bus"), (640, 480))
    return write_y4m(workdir / "camera.y4m", [picture] * 10, fps=10)


@pytest.fixture(scope="module")
def fake_microphone(workdir: Path) -> Path:
    """What the user says: a question after 4 s of silence (the session is up by then) and quiet for its reply;
    then a request for a long story, interrupted 2 s after it ends (a barge-in). Chromium loops the file, so a
    slow start that cuts the first question still gets a whole one later."""
    pcm = np.concatenate([silence(4.0), speech(QUESTION), silence(9.0),
                          speech(LONG_REQUEST), silence(2.0), speech(INTERRUPTION), silence(8.0)])
    return write_wav(workdir / "question.wav", pcm, OUT_RATE)


@pytest.fixture(scope="module")
def media_root(workdir: Path) -> Path:
    root = workdir / "media"
    root.mkdir()
    slideshow(root / "people.mp4", [("bus", 2.0), ("zidane", 2.0)], fps=10)
    return root


@pytest.fixture(scope="module")
def live_server(workdir: Path, media_root: Path) -> Iterator[VigilProcess]:
    """The real CLI with the default detector (YOLO pose) and the voice loop, behind a token."""
    config = {
        "webrtc": {"host_addresses": ["127.0.0.1"]},
        "sources": {"media_root": str(media_root)},
        "sessions": {"metrics_interval_s": 1.0},
        "video": {"target_fps": 2, "zones": [DOOR]},
        # The fake microphone is digitally silent once the question has played; that is not what we test here.
        "voice": {"enabled": True, "end_of_turn_silence_ms": 500, "silent_track_s": 600},
    }
    with running_vigil(workdir, config, token=TOKEN) as server:
        yield server


@pytest.fixture(scope="module")
def playwright() -> Iterator[Any]:
    with playwright_driver() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Any, workdir: Path, fake_camera: Path, fake_microphone: Path) -> Iterator[Any]:
    with chromium(playwright, workdir / "profile", video_file=fake_camera, audio_file=fake_microphone,
                  loop_audio=True) as context:
        context.requested_urls = []  # every request any page makes: nothing may come from outside Vigil
        context.on("request", lambda request: context.requested_urls.append(request.url))
        yield context


def state(page: Any, expression: str = "window.vigilState") -> Any:
    return page.evaluate(f"JSON.parse(JSON.stringify({expression}))")


def wait_for(page: Any, predicate: str, timeout_s: float = 60.0) -> None:
    """Wait until ``predicate`` (JS over ``s``, the page's vigilState) holds; on timeout, show the state."""
    try:
        page.wait_for_function(f"(() => {{ const s = window.vigilState; return s && ({predicate}); }})()",
                               timeout=timeout_s * 1000, polling=200)
    except Exception as error:
        snapshot = state(page)
        for bulky in ("frameLatency", "hello"):
            snapshot.pop(bulky, None)
        raise AssertionError(f"page never reached {predicate!r}; vigilState: {snapshot}") from error


def open_dashboard(context: Any, server: VigilProcess, token: str | None = TOKEN) -> Any:
    page = context.new_page()
    page.goto(server.url)
    wait_for(page, "s.ready && s.auth.status !== 'unknown'", 20)
    if token is not None:
        assert page.locator("#token-dialog").is_visible(), "the page did not ask for the token"
        page.fill("#token-input", token)
        page.click("#token-submit")
        wait_for(page, "s.auth.status === 'ok'", 20)
    return page


def screenshot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    page.screenshot(path=str(path), full_page=True)
    return path


@pytest.fixture(scope="module")
def live_page(browser: Any, live_server: VigilProcess) -> Iterator[Any]:
    """One page connected with the fake camera and microphone, shared by the tests that watch it."""
    page = open_dashboard(browser, live_server)
    page.click("#connect")
    wait_for(page, "s.connection.state === 'live' && s.hello !== null", 30)
    yield page
    page.close()


def test_camera_overlay_draws_person_boxes_with_tracks_and_keypoints(live_page: Any) -> None:
    page = live_page
    # The tracker gives an object its id from its second sighting.
    wait_for(page, "s.detections.last && s.detections.last.objects.filter("
                   "(o) => o.label === 'person' && o.track_id != null).length >= 3", 60)
    drawn = state(page, "vigilState.drawn")
    assert drawn["keypoints"] > 10 and drawn["zones"] == 1, drawn
    last = state(page, "vigilState.detections.last")
    people = [o for o in last["objects"] if o["label"] == "person"]
    assert sum(o.get("track_id") is not None for o in people) >= 3, people
    assert all(len(o["keypoints"]) == 17 for o in people), people
    # What the canvas says it drew, and that it really painted there: the box's left edge is not transparent.
    canvas = page.locator("#overlay")
    assert int(canvas.get_attribute("data-boxes")) == len(last["objects"])
    assert canvas.get_attribute("data-labels").count("person") == len(people)
    # Unconfirmed objects (video.objects) are drawn apart (grey, dashed) and counted so.
    assert int(canvas.get_attribute("data-unconfirmed")) == sum(o.get("confirmed") is False for o in last["objects"])
    assert all(o.get("confirmed") is not None for o in people), people  # every tracked detection says which
    box = max(people, key=lambda o: o["conf"])["box"]
    alpha = page.evaluate(
        """([x1, y1, y2]) => {
            const canvas = document.getElementById('overlay');
            const video = document.getElementById('video');
            const ratio = window.devicePixelRatio || 1;
            const scale = Math.min(canvas.clientWidth / video.videoWidth, canvas.clientHeight / video.videoHeight);
            const left = (canvas.clientWidth - video.videoWidth * scale) / 2;
            const top = (canvas.clientHeight - video.videoHeight * scale) / 2;
            const x = (left + x1 * video.videoWidth * scale) * ratio;
            const y = (top + (y1 + y2) / 2 * video.videoHeight * scale) * ratio;
            return canvas.getContext('2d').getImageData(Math.round(x), Math.round(y), 1, 1).data[3];
        }""",
        [box[0], box[1], box[3]],
    )
    assert alpha > 0, "nothing painted on the person's box edge"
    assert re.search(r"Seeing \d+ persons", page.text_content("#object-summary"))
    assert "yolo" in page.text_content("#video-model").lower()
    assert page.get_attribute("#status", "data-state") == "live"


def test_spoken_question_gets_transcript_reply_and_audible_audio(live_page: Any) -> None:
    page = live_page
    wait_for(page, "s.conversation.some((e) => e.role === 'user' && e.final)", 90)
    wait_for(page, "s.conversation.some((e) => e.role === 'assistant' && e.done && e.text.trim())", 90)
    conversation = state(page, "vigilState.conversation")
    question = next(e for e in conversation if e["role"] == "user" and e["final"])
    assert {"how", "many", "people"} <= set(re.findall(r"[a-z]+", question["text"].lower())), question
    # The DOM shows the final transcript (not greyed) and the reply.
    user_item = page.locator("#conversation li.user").first
    assert "partial" not in (user_item.get_attribute("class") or "")
    assert "people" in user_item.text_content().lower()
    reply = next(e for e in conversation if e["role"] == "assistant" and e["done"])
    assert reply["text"].strip() in page.text_content("#conversation")
    # The spoken reply arrived as audio with a level (RTCPeerConnection.getStats, inbound-rtp audio).
    wait_for(page, "s.replyAudio.maxAudioLevel > 0.01 && s.replyAudio.totalAudioEnergy > 0", 30)
    # The turn's timings reach the chart once the reply has played.
    wait_for(page, "s.turnMetrics.length >= 1", 60)
    metrics = state(page, "vigilState.turnMetrics[0]")
    assert metrics["voice_to_voice_ms"] > 0 and metrics["end_of_speech_to_final_ms"] > 0, metrics
    wait_for(page, "s.frameLatency.length >= 3 && s.media && s.media.video.frames_analyzed > 0", 30)
    assert "tiny" in page.text_content("#voice-model").lower()
    path = screenshot(page, "dashboard-live.png")
    assert path.stat().st_size > 10_000


def test_speaking_over_a_reply_shows_the_barge_in(live_page: Any) -> None:
    page = live_page
    wait_for(page, "s.bargeIns >= 1", 120)
    # Words were shown while being spoken (greyed partial transcripts) before their final transcript.
    assert state(page, "vigilState.partialsShown") >= 1
    barged = [e for e in state(page, "vigilState.conversation") if e["role"] == "assistant" and e["bargedIn"]]
    assert barged and barged[0]["done"] and barged[0]["interrupted"], barged  # ended, and said to be cut
    item = page.locator(f"#conversation li.assistant.barged[data-turn='{barged[0]['turn']}']")
    assert item.count() == 1 and "streaming" not in (item.get_attribute("class") or "")
    assert page.locator("#barge-in").is_visible()  # shown for a few seconds after the event
    screenshot(page, "dashboard-barge-in.png")


def test_target_fps_control_changes_the_session_rate(live_page: Any, live_server: VigilProcess) -> None:
    page = live_page
    page.fill("#fps", "1")
    page.dispatch_event("#fps", "change")
    wait_for(page, "s.config && s.config.video.target_fps === 1", 20)
    session_id = state(page, "vigilState.connection.sessionId")
    assert live_server.api("GET", f"/api/sessions/{session_id}")["config"]["video"]["target_fps"] == 1


def test_server_side_file_source_picked_from_the_list_shows_its_detections(browser: Any,
                                                                          live_server: VigilProcess) -> None:
    source = live_server.api("POST", "/api/sources", {"path": "people.mp4", "loop": True, "name": "lobby file"})
    page = open_dashboard(browser, live_server)
    try:
        page.click("#tab-server")
        row = page.locator(f"#sources tr[data-source-id='{source['id']}']")
        row.wait_for(timeout=10_000)
        assert "lobby file" in row.text_content()
        row.locator("button.watch").click()
        wait_for(page, f"s.connection.mode === 'source' && s.connection.sourceId === '{source['id']}' "
                       "&& s.connection.state === 'live'", 30)
        wait_for(page, "s.drawn.labels.includes('person')", 60)
        assert int(page.get_attribute("#overlay", "data-boxes")) >= 1
        assert state(page, "vigilState.hello.session") == source["id"]
        assert "yolo" in page.text_content("#video-model").lower()
        page.locator(f"#sources tr.watching[data-source-id='{source['id']}']").wait_for(timeout=10_000)
        screenshot(page, "dashboard-source.png")
        # A file that is not there: the server's reason, on the page.
        page.fill("#source-location", "no-such-clip.mp4")
        page.click("#add-source button[type=submit]")
        wait_for(page, "s.banner && s.banner.code === 'invalid_path'", 10)
        assert "no such file under the media root" in page.text_content("#banner")
        assert state(page, "vigilState.connection.state") == "live", "a refused source must not end the watch"
    finally:
        live_server.api("DELETE", f"/api/sources/{source['id']}")
        page.close()


def test_every_asset_is_served_by_vigil(live_page: Any, browser: Any, live_server: VigilProcess) -> None:
    assert any(url.endswith("/static/app.js") for url in browser.requested_urls)
    outside = [url for url in browser.requested_urls
               if not url.startswith((live_server.url, "data:", "blob:", "ws://127.0.0.1"))]
    assert not outside, f"the page fetched from elsewhere: {outside}"
    # The modules load without a token (the page must be able to ask for one) and are served as JavaScript.
    for name in ("app.js", "api.js", "links.js", "overlay.js", "charts.js", "style.css"):
        with urllib.request.urlopen(f"{live_server.url}/static/{name}", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith(("text/javascript", "application/javascript",
                                                                 "text/css")), (name, response.headers)


def test_wrong_token_is_refused_with_a_clear_message(browser: Any, live_server: VigilProcess) -> None:
    page = open_dashboard(browser, live_server, token=None)
    try:
        assert state(page, "vigilState.auth.status") == "needed"
        assert page.locator("#token-dialog").is_visible()
        assert "needs an access token" in page.text_content("#banner")
        page.fill("#token-input", "not-the-token")
        page.click("#token-submit")
        wait_for(page, "s.auth.status === 'wrong'", 20)
        assert "Wrong token" in page.text_content("#token-error")
        assert page.locator("#token-dialog").is_visible(), "the page let a wrong token through"
        assert "rejected the token" in page.text_content("#banner")
        screenshot(page, "dashboard-wrong-token.png")
        page.fill("#token-input", TOKEN)
        page.click("#token-submit")
        wait_for(page, "s.auth.status === 'ok'", 20)
        assert not page.locator("#token-dialog").is_visible()
        assert page.locator("#banner").is_hidden()
    finally:
        page.close()


def test_camera_permission_denied_is_explained(playwright: Any, workdir: Path, live_server: VigilProcess,
                                               fake_camera: Path) -> None:
    # No "--use-fake-ui-for-media-stream": the permission request is refused, as when a person clicks "Block".
    with chromium(playwright, workdir / "profile-denied", grant_media=False, video_file=fake_camera) as context:
        page = open_dashboard(context, live_server)
        page.click("#connect")
        wait_for(page, "s.connection.state === 'failed'", 30)
        failure = state(page)
        assert failure["banner"]["code"] == "permission_denied", failure["banner"]
        assert "denied" in page.text_content("#banner")
        assert "denied" in page.text_content("#status-reason")
        assert page.text_content("#status-text") == "Failed"
        screenshot(page, "dashboard-permission-denied.png")


def test_server_going_down_is_reported(browser: Any, workdir: Path) -> None:
    # A second, model-free server that this test may stop.
    config = {"webrtc": {"host_addresses": ["127.0.0.1"]}, "models": {"detector": {"backend": "none"}},
              "voice": {"enabled": False}}
    server = VigilProcess(workdir, config).start()
    page = open_dashboard(browser, server, token=None)
    try:
        page.click("#connect")
        wait_for(page, "s.connection.state === 'live'", 30)
        server.stop()
        # The live session drops: the page says it is reconnecting, then that the server cannot be reached.
        wait_for(page, "s.connection.state === 'reconnecting'", 30)
        wait_for(page, "s.banner && s.banner.code === 'unreachable'", 30)
        assert "Cannot reach the Vigil server" in page.text_content("#banner")
        assert page.text_content("#status-text") == "Reconnecting…"
        screenshot(page, "dashboard-server-down.png")
        # Connecting again while it is down fails at once, with the reason.
        page.click("#disconnect")
        page.click("#connect")
        wait_for(page, "s.connection.state === 'failed'", 30)
        assert "Cannot reach the Vigil server" in page.text_content("#status-reason")
    finally:
        server.stop()
        page.close()


@pytest.mark.skipif(not face_photos.available(), reason="run scripts/setup.sh (face photos)")
def test_people_panel_enrols_from_a_photo_and_deletes(browser: Any, live_server: VigilProcess,
                                                       workdir: Path) -> None:
    page = open_dashboard(browser, live_server)
    try:
        cat = workdir / "cat.png"
        Image.fromarray(real_image("chelsea")).save(cat)
        page.fill("#faces-name", "Barack")
        page.set_input_files("#faces-file", str(cat))
        page.click("#faces-form button[type=submit]")
        wait_for(page, "s.faces.error && s.faces.error.code === 'no_face'", 30)
        assert "no face found" in page.text_content("#faces-status")
        page.set_input_files("#faces-file", str(face_photos.photo_path("obama.jpg")))
        page.click("#faces-form button[type=submit]")
        wait_for(page, "s.faces.people.length === 1 && s.faces.error === null", 30)
        assert page.text_content("#faces-list").startswith("Barack (1)")
        page.click("#faces-list button.delete")
        wait_for(page, "s.faces.people.length === 0", 30)
        assert "deleted" in page.text_content("#faces-status")
    finally:
        page.close()
