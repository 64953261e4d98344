"""Camera URLs: normalised before validation, passwords never leave (states, events, listings, logs, FFmpeg's
messages), permanent errors fail at once while transient ones are retried."""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest

from pipelines.sources.urls import redact_text, redact_url, url_secrets
from tests.integration.test_sources import Watcher
from tests.support.ports import free_port
from tests.support.rtsp import RtspCamera

PASSWORD = "hunter2-S3cr3t"


def test_redaction_masks_the_password_wherever_it_appears() -> None:
    url = "rtsp://bob:p%40ss:w@rd@[::1]:8554/cam"
    assert redact_url(url) == "rtsp://bob:***@[::1]:8554/cam"
    message = f"Server returned 401 Unauthorized: '{url}' (password p@ss:w@rd)"
    redacted = redact_text(message, url_secrets(url))
    assert "p%40ss" not in redacted and "p@ss" not in redacted and "rtsp://bob:***@[::1]:8554/cam" in redacted
    assert redact_url("rtsp://cam.local/x") == "rtsp://cam.local/x"


def test_redaction_masks_a_token_only_userinfo() -> None:
    url = "rtsp://tok%2Fen-S3cr3t@cam.local:554/x"  # no ':': the userinfo is the secret (a camera token)
    assert redact_url(url) == "rtsp://***@cam.local:554/x"
    message = f"Server returned 401 Unauthorized: '{url}' (token tok/en-S3cr3t)"
    redacted = redact_text(message, url_secrets(url))
    assert "S3cr3t" not in redacted and "rtsp://***@cam.local:554/x" in redacted, redacted
    assert redact_text("failed to open rtsp://tok@cam/x") == "failed to open rtsp://***@cam/x"  # secret unknown
    assert redact_url("rtsp://bob:pw@cam/x") == "rtsp://bob:***@cam/x"  # user and password: the user stays


def test_redaction_masks_secret_query_and_path_parameters() -> None:
    url = "rtsp://cam.local/live;AUTH=a%2Fb-S3cr3t/x?user=bob&password=p-S3cr3t&PwD=q+S3cr3t&api%5Fkey=k-S3cr3t"
    shown = redact_url(url)
    assert shown == "rtsp://cam.local/live;AUTH=***/x?user=bob&password=***&PwD=***&api%5Fkey=***", shown
    message = f"Server returned 404 Not Found: '{url}' (decoded: a/b-S3cr3t, q S3cr3t)"
    redacted = redact_text(message, url_secrets(url))
    assert "S3cr3t" not in redacted and "user=bob" in redacted, redacted
    for kept in ("rtsp://cam/x?channel=1&subtype=0", "rtsp://cam/x;stream=main?keyframe=1&monkey=2"):
        assert redact_url(kept) == kept
    for key in ("password", "passwd", "pwd", "pass", "token", "access_token", "auth", "key", "apikey", "secret",
                "sig", "signature"):
        assert redact_url(f"rtsp://cam/x?{key.upper()}=v1") == f"rtsp://cam/x?{key.upper()}=***", key


# How a camera URL may carry its secret -> what stays visible of it once redacted, and whether the test camera
# serves that URL (its mount has no path parameters: that form is only ever a 404).
SECRET_FORMS = {
    "userinfo": ("rtsp://bob:{password}@{hostpath}", "bob:***@", True),
    "query": ("rtsp://{hostpath}?user=bob&password={password}", "password=***", True),
    "encoded query": ("rtsp://{hostpath}?PwD={encoded}&channel=1", "PwD=***", True),
    "path parameter": ("rtsp://{hostpath};auth={password}", ";auth=***", False),
}


@pytest.mark.parametrize("form", list(SECRET_FORMS))
async def test_a_camera_password_appears_in_no_state_event_listing_or_log(vigil, caplog, capfd, form: str):
    caplog.set_level(logging.DEBUG)
    server = await vigil()
    camera = RtspCamera(free_port())
    await asyncio.to_thread(camera.start)
    seen: list[str] = []
    template, marker, served = SECRET_FORMS[form]
    try:
        secret_url = template.format(password=PASSWORD, encoded=PASSWORD.replace("-", "%2D"),
                                     hostpath=camera.url.removeprefix("rtsp://"))
        async with aiohttp.ClientSession() as http:
            async with http.post(f"{server.url}/api/sources", json={"url": secret_url}) as response:
                source = await response.json()
                seen.append(await response.text())
            assert response.status == 201 and source["location"] == redact_url(secret_url)
            assert marker in source["location"]
            async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
                watcher = Watcher(ws)
                if served:
                    await watcher.state("live")
                    await asyncio.to_thread(camera.stop)  # FFmpeg's "connection refused" quotes the URL
                    lost = await watcher.state("reconnecting", timeout=30)
                    refused = await watcher.next(lambda m: m["type"] == "event" and m["name"] == "source.state"
                                                 and "cannot connect" in m["data"].get("reason", ""), timeout=30)
                    assert lost["data"]["attempt"] >= 1
                else:
                    refused = await watcher.state("failed", timeout=30)  # "404 Not Found: 'rtsp://...'"
                assert marker in refused["data"]["reason"]  # FFmpeg quoted the URL: redacted, not dropped
                async with http.get(f"{server.url}/api/sources/{source['id']}") as response:
                    seen.append(await response.text())
                async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
                    assert response.status == 204
                await watcher.state("stopped")
                seen.extend(str(message) for message in watcher.seen)

            # A path the camera does not have: a 404, permanent, so `failed` at once, with a redacted reason.
            await asyncio.to_thread(camera.start)
            async with http.post(f"{server.url}/api/sources",
                                 json={"url": secret_url.replace("/cam", "/nope")}) as response:
                missing = await response.json()
            async with http.ws_connect(f"{server.url}/api/sources/{missing['id']}/results") as ws:
                watcher = Watcher(ws)
                failed = await watcher.state("failed", timeout=30)
                seen.extend(str(message) for message in watcher.seen)
            assert "404" in failed["data"]["reason"] and marker in failed["data"]["reason"]
            assert not [m for m in watcher.seen if m.get("data", {}).get("state") == "reconnecting"]
            async with http.get(f"{server.url}/api/sources") as response:
                listing = await response.text()
                seen.append(listing)
            assert '"state":"failed"' in listing.replace(" ", "")
    finally:
        await asyncio.to_thread(camera.stop)
    out, err = capfd.readouterr()
    logged = [record.getMessage() for record in caplog.records]
    assert any(("cannot connect" if served else "404") in line for line in logged)  # logged, redacted
    for where, text in [("responses and messages", "\n".join(seen)), ("log records", "\n".join(logged)),
                        ("stdout/stderr", out + err)]:
        assert PASSWORD not in text, where


@pytest.mark.parametrize("given, expected", [
    ("  rtsp://127.0.0.1:{port}/cam\t", "rtsp://127.0.0.1:{port}/cam"),
    ("RTSP://127.0.0.1:{port}/cam", "rtsp://127.0.0.1:{port}/cam"),
])
async def test_camera_urls_are_normalised_before_use(vigil, given: str, expected: str):
    server = await vigil(sources={"reconnect_initial_s": 5.0, "reconnect_max_s": 10.0})
    port = free_port()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/sources", json={"url": given.format(port=port)}) as response:
            source = await response.json()
        assert response.status == 201 and source["location"] == expected.format(port=port)
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            reconnecting = await Watcher(ws).state("reconnecting")  # a refused connection is transient
        assert "Connection refused" in reconnecting["data"]["reason"]
        async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
            assert response.status == 204


@pytest.mark.parametrize("url", ["rtsp://", "rtsp:/path", "rtsp:///cam", "rtsp://host /cam", "rtsp://h:99999/",
                                 "\nhttp://h/x", "file:///etc/passwd", " /etc/passwd", "rtsp://a:b@"])
async def test_urls_that_name_no_camera_are_refused(vigil, url: str):
    server = await vigil()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/sources", json={"url": url}) as response:
            body = await response.json()
    assert response.status == 422 and body["error"]["code"] == "invalid_body", body
    assert "b@" not in body["error"]["message"]
    assert len(server.sources) == 0
