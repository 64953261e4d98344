"""Bad input gets a clear 4xx JSON error (or an error message on the data channel); others keep working."""

from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from server.cli.client import VigilClient, VigilError


async def _request(method: str, url: str, **kwargs) -> tuple[int, dict]:
    async with aiohttp.ClientSession() as http, http.request(method, url, **kwargs) as response:
        return response.status, await response.json(content_type=None)


def _assert_error(status: int, body: dict, expected_status: int, code: str) -> None:
    assert status == expected_status, body
    assert body["error"]["code"] == code
    assert body["error"]["message"]


async def test_bad_offers_and_bodies_leave_a_working_session_alone(vigil):
    server = await vigil(server={"max_body_bytes": 64 * 1024})
    healthy = VigilClient(server.url)
    await healthy.connect()
    await healthy.next_message("hello")

    offer = f"{server.url}/offer"
    headers = {"Content-Type": "application/json"}
    _assert_error(*await _request("POST", offer, data="{nope", headers=headers), 400, "invalid_json")
    _assert_error(*await _request("POST", offer, data="[]", headers=headers), 422, "invalid_body")
    _assert_error(*await _request("POST", offer, json={"sdp": "v=0", "type": "answer"}), 422, "invalid_body")
    _assert_error(*await _request("POST", offer, data="sdp", headers={"Content-Type": "text/plain"}),
                  415, "unsupported_media_type")
    _assert_error(*await _request("POST", offer, json={"sdp": "hello m=application", "type": "offer"}),
                  400, "invalid_sdp")
    audio_only = ("v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\n"
                  "m=audio 9 UDP/TLS/RTP/SAVPF 0\r\nc=IN IP4 0.0.0.0\r\na=rtpmap:0 PCMU/8000\r\n")
    _assert_error(*await _request("POST", offer, json={"sdp": audio_only, "type": "offer"}), 400, "no_data_channel")
    _assert_error(*await _request("POST", offer, json={"sdp": "x" * 200_000, "type": "offer"}),
                  413, "body_too_large")
    status, body = await _request("POST", offer, json={"sdp": "v=0 m=application", "type": "offer",
                                                       "options": {"video": {"target_fps": 0}}})
    _assert_error(status, body, 422, "invalid_body")
    assert "target_fps" in body["error"]["message"]
    _assert_error(*await _request("GET", f"{server.url}/api/sessions/nope"), 404, "not_found")
    _assert_error(*await _request("DELETE", f"{server.url}/api/sources/nope"), 404, "not_found")
    _assert_error(*await _request("GET", f"{server.url}/no/such/route"), 404, "not_found")
    _assert_error(*await _request("PUT", f"{server.url}/offer"), 405, "method_not_allowed")

    # invalid data-channel messages: each answered with an error, the channel stays up
    for bad, code in [("{oops", "invalid_json"), ('{"v":1,"type":"dance"}', "invalid_message"),
                      ('{"v":1,"type":"config","video":{"target_fps":"fast"}}', "invalid_message"),
                      ("x" * 70_000, "message_too_large")]:
        healthy.send(bad)
        error = await healthy.next_message("error")
        assert error["code"] == code, error
    healthy.send({"v": 1, "type": "ping", "id": "still-there"})
    assert (await healthy.next_message("pong"))["id"] == "still-there"
    status, body = await _request("GET", f"{server.url}/healthz")
    assert status == 200 and body["sessions"] == 1
    await healthy.close()


async def test_session_limit_is_a_429_and_frees_up(vigil):
    server = await vigil(sessions={"max_sessions": 1})
    first = VigilClient(server.url)
    await first.connect()
    second = VigilClient(server.url)
    with pytest.raises(VigilError) as rejected:
        await second.connect()
    assert rejected.value.status == 429 and rejected.value.body["error"]["code"] == "too_many_sessions"
    await first.close()
    third = VigilClient(server.url)
    await third.connect()
    await third.next_message("hello")
    await third.close()


async def test_paths_outside_the_media_root_are_refused(vigil, clip_dir: Path, tmp_path: Path):
    server = await vigil()
    outside = tmp_path / "secret.mp4"
    outside.write_bytes((clip_dir / "clip.mp4").read_bytes())
    link = clip_dir / "escape.mp4"
    if not link.exists():
        os.symlink(outside, link)
    sources = f"{server.url}/api/sources"
    for path in ["../secret.mp4", str(outside), "escape.mp4", "/etc/passwd", f"{clip_dir}/../{tmp_path.name}"]:
        status, body = await _request("POST", sources, json={"path": path})
        assert status in (400, 403), (path, body)
        assert body["error"]["code"] == "invalid_path"
    _assert_error(*await _request("POST", sources, json={"path": "missing.mp4"}), 400, "invalid_path")
    _assert_error(*await _request("POST", sources, json={"url": "http://example.invalid/x"}), 422, "invalid_body")
    _assert_error(*await _request("POST", sources, json={"url": "rtsp://a", "path": "clip.mp4"}), 422,
                  "invalid_body")
    status, listed = await _request("GET", sources)
    assert status == 200 and listed["sources"] == []


async def test_auth_token_is_required_everywhere_when_set(vigil):
    server = await vigil(auth={"token": "s3cret"})
    for method, path in [("GET", "/api/sessions"), ("GET", "/metrics"),
                         ("GET", "/openapi.json"), ("POST", "/api/sources"), ("POST", "/offer")]:
        _assert_error(*await _request(method, server.url + path), 401, "unauthorized")
        status, body = await _request(method, server.url + path, headers={"Authorization": "Bearer wrong"})
        _assert_error(status, body, 401, "unauthorized")
        assert body["error"]["message"] == "wrong token"
    # /healthz is the liveness probe (an orchestrator holds no secret): without the token it says only "ok"
    assert await _request("GET", f"{server.url}/healthz") == (200, {"status": "ok"})
    status, health = await _request("GET", f"{server.url}/healthz", headers={"Authorization": "Bearer s3cret"})
    assert status == 200 and health["sessions"] == 0 and health["version"]
    status, _ = await _request("GET", f"{server.url}/api/sessions?token=s3cret")
    assert status == 200
    # The scheme is case-insensitive (RFC 9110 11.1), on /api and on /v1 alike, and so is the space after it.
    for scheme in ("Bearer", "bearer", "BEARER", "bEaReR", "Bearer ", "bearer\t"):
        for path in ("/api/sessions", "/v1/models"):
            status, body = await _request("GET", server.url + path, headers={"Authorization": f"{scheme} s3cret"})
            assert status == 200, (scheme, path, body)
    with pytest.raises(VigilError) as rejected:
        await VigilClient(server.url, token="nope").connect()
    assert rejected.value.status == 401
    client = VigilClient(server.url, token="s3cret")
    await client.connect()
    assert (await client.next_message("hello"))["type"] == "hello"
    await client.close()


async def test_openapi_describes_the_rest_api(vigil):
    server = await vigil()
    status, spec = await _request("GET", f"{server.url}/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/offer", "/api/sessions/{session_id}", "/api/sources", "/healthz", "/metrics"} <= set(spec["paths"])
    offer = spec["paths"]["/offer"]["post"]
    assert offer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/OfferRequest")
    assert "OfferResponse" in spec["components"]["schemas"]
    assert json.dumps(spec)  # serialisable end to end


async def test_openapi_describes_the_v1_endpoints_that_are_enabled(vigil):
    server = await vigil()
    status, spec = await _request("GET", f"{server.url}/openapi.json")
    assert status == 200
    paths = spec["paths"]
    chat = paths["/v1/chat/completions"]["post"]
    assert chat["summary"] and chat["operationId"] == "chat_completions"
    schema_ref = chat["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    body_schema = spec["components"]["schemas"][schema_ref.rsplit("/", 1)[1]]
    assert {"model", "messages", "stream", "logprobs"} <= set(body_schema["properties"])
    assert set(paths["/v1/models"]) == {"get"} and "404" in paths["/v1/models/{model}"]["get"]["responses"]
    upload = paths["/v1/audio/transcriptions"]["post"]["requestBody"]["content"]["multipart/form-data"]["schema"]
    assert upload["properties"]["file"]["format"] == "binary" and upload["required"] == ["file", "model"]
    assert "202" in paths["/v1/audio/transcriptions/jobs"]["post"]["responses"]
    assert {"get", "delete"} == set(paths["/v1/audio/transcriptions/jobs/{job_id}"])
    speech = paths["/v1/audio/speech"]["post"]["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    assert "input" in spec["components"]["schemas"][speech.rsplit("/", 1)[1]]["properties"]
    # every documented operation is a registered route (none invented)
    routes = {(r.method, r.resource.canonical) for r in server.app.router.routes() if r.resource is not None}
    for path, operations in paths.items():
        for method in operations:
            assert (method.upper(), path) in routes, (method, path)

    without = await vigil(api={"chat": False}, transcription={"enabled": False}, speech={"enabled": False})
    _, spec = await _request("GET", f"{without.url}/openapi.json")
    assert not [path for path in spec["paths"] if path.startswith("/v1/")]  # what is off is not described
