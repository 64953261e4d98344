"""Hostile client input: one message never ends a session or a subscriber; bogus offers are refused before
they take a slot; an offer that breaks aiortc's own cleanup still gets its 400."""

from __future__ import annotations

import asyncio
import json
import logging
import re

import aiohttp
import pytest
from aiohttp import web

from server.cli.client import VigilClient
from server.http.serve import start_serving
from tests.support.vigil_process import VigilProcess

# Each of these once ended the session (an exception escaped the data-channel callback) or the subscriber.
DEEP_ARRAY = "[" * 2000 + "]" * 2000
HOSTILE_MESSAGES: list[tuple[str, str]] = [
    # A lone surrogate: once the pong could not be serialised; now the parser refuses it (not Unicode text)
    ('{"v":1,"type":"ping","id":"\\ud800"}', "error"),
    ('{"v":1,"type":"ping","id":"\\udfff\\ud800x"}', "error"),
    ('{"v":1,"type":"\\ud800"}', "error"),  # ... nor the error that names it as `ref`
    (DEEP_ARRAY, "error"),  # RecursionError in json.loads
    ('{"v":1,"type":"config","video":' + "[" * 900 + "]" * 900 + "}", "error"),  # ... in validation
    ('{"v":1,"type":"config","video":{"zones":' + '{"a":' * 1500 + "1" + "}" * 1500 + "}}", "error"),
    ('"' + "é" * 40_000 + '"', "error"),  # 40,000 characters, 80,000 bytes: over the byte limit
]


async def _still_answers(client: VigilClient, marker: str) -> None:
    client.send({"v": 1, "type": "ping", "id": marker})
    assert (await client.next_message("pong", where=lambda m: m.get("id") == marker))["id"] == marker


async def test_no_single_data_channel_message_ends_a_session(vigil):
    server = await vigil()
    victim, bystander = VigilClient(server.url), VigilClient(server.url)
    await victim.connect()
    await bystander.connect()
    for raw, answer in HOSTILE_MESSAGES:
        victim.send(raw)
        reply = await victim.next_message(answer)
        if answer == "pong":
            assert reply["id"] == json.loads(raw)["id"]  # the odd string comes back intact (JSON-escaped)
        else:
            assert reply["code"] in ("invalid_json", "invalid_message", "message_too_large"), reply
        await _still_answers(victim, f"after {raw[:20]}")
    await _still_answers(bystander, "bystander")
    assert victim.pc.connectionState == "connected" and len(server.sessions) == 2
    await victim.close()
    await bystander.close()


async def test_no_single_websocket_message_ends_a_subscriber(vigil):
    server = await vigil()
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True}) as response:
            source = await response.json()
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:

            async def next_of(kind: str) -> dict:
                async with asyncio.timeout(20):
                    while True:
                        msg = await ws.receive()
                        assert msg.type == aiohttp.WSMsgType.TEXT, msg
                        message = json.loads(msg.data)
                        if message["type"] == kind:
                            return message

            for raw, answer in [*HOSTILE_MESSAGES, ("x" * 100_000, "error")]:
                await ws.send_str(raw)
                await next_of(answer)
                await ws.send_str(json.dumps({"v": 1, "type": "ping", "id": "alive"}))
                assert (await next_of("pong"))["id"] == "alive"
        async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
            assert response.status == 204


def _valid_offer_sdp() -> asyncio.Future:
    async def make() -> str:
        client = VigilClient("http://unused")
        await client.pc.setLocalDescription(await client.pc.createOffer())
        sdp = client.pc.localDescription.sdp
        await client.pc.close()
        return sdp
    return asyncio.ensure_future(make())


async def _post_offer(url: str, sdp: str) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/offer", json={"sdp": sdp, "type": "offer"}) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


def _without(sdp: str, prefix: str) -> str:
    return "".join(line + "\r\n" for line in sdp.splitlines() if line and not line.startswith(prefix))


@pytest.mark.parametrize("mutation", ["a=fingerprint:", "a=ice-ufrag:", "a=ice-pwd:", "a=sctp-port:"])
async def test_offers_no_peer_could_connect_are_refused_before_taking_a_slot(vigil, mutation: str):
    server = await vigil(sessions={"max_sessions": 1})
    sdp = await _valid_offer_sdp()
    for _ in range(3):
        status, body, _ = await _post_offer(server.url, _without(sdp, mutation))
        assert status == 400 and body["error"]["code"] == "not_connectable", body
        assert mutation.split(":")[0][2:] in body["error"]["message"].replace("SCTP port", "sctp-port").replace(
            "DTLS fingerprint", "fingerprint").replace("ICE credentials (ice-ufrag, ice-pwd)", "ice-ufrag ice-pwd")
    assert len(server.sessions) == 0
    client = VigilClient(server.url)  # the one slot is still free
    await client.connect()
    await client.close()


async def test_bundle_naming_a_missing_mid_is_a_400_not_a_500(vigil):
    server = await vigil()
    sdp = (await _valid_offer_sdp()).replace("a=group:BUNDLE 0", "a=group:BUNDLE 7 0")  # pc.close() raises
    status, body, _ = await _post_offer(server.url, sdp)
    assert status == 400 and body["error"]["code"] == "invalid_sdp", body
    assert len(server.sessions) == 0 and server.sessions.occupied == 0


async def test_an_offer_that_never_connects_frees_its_slot_after_connect_timeout(vigil):
    server = await vigil(sessions={"max_sessions": 1}, webrtc={"connect_timeout_s": 1.0})
    status, body, _ = await _post_offer(server.url, await _valid_offer_sdp())  # nobody will ever connect
    assert status == 200, body
    status, body, _ = await _post_offer(server.url, await _valid_offer_sdp())
    assert status == 429 and body["error"]["code"] == "too_many_sessions"
    async with asyncio.timeout(15):
        while len(server.sessions):  # noqa: ASYNC110 (polling the registry; it has no event to wait on)
            await asyncio.sleep(0.1)
    client = VigilClient(server.url)
    await client.connect()
    await client.close()


# ---------------------------------------------------------------- HTTP bodies

DEEP_JSON = "[" * 3000 + "]" * 3000


def _errors_500(exposition: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
               if line.startswith("vigil_http_errors_total{") and 'status="500"' in line)


async def _exposition(url: str) -> str:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        return await response.text()


async def _raw_http(url: str, request: bytes, answer: bool = True) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(request)
    await writer.drain()
    if not answer:  # hang up mid-body
        await asyncio.sleep(0.2)
        writer.close()
        return b""
    async with asyncio.timeout(20):
        data = await reader.read()
    writer.close()
    return data


@pytest.mark.parametrize("path", ["/offer", "/api/sources", "/v1/chat/completions", "/v1/audio/speech"])
async def test_json_nested_too_deeply_is_a_400(vigil, path: str):
    server = await vigil()
    async with aiohttp.ClientSession() as http, http.post(
            server.url + path, data=DEEP_JSON, headers={"Content-Type": "application/json"}) as response:
        body = await response.json()
    assert response.status == 400, body
    assert "nested too deeply" in body["error"]["message"]


async def test_json_nested_too_deeply_in_session_config_is_a_400(vigil):
    server = await vigil()
    client = VigilClient(server.url)
    session_id = await client.connect()
    async with aiohttp.ClientSession() as http, http.post(
            f"{server.url}/api/sessions/{session_id}/config", data=DEEP_JSON,
            headers={"Content-Type": "application/json"}) as response:
        body = await response.json()
    assert response.status == 400 and body["error"]["code"] == "invalid_json", body
    await _still_answers(client, "config-survived")
    await client.close()


async def test_a_malformed_multipart_part_header_is_a_400(vigil):
    server = await vigil()
    form = (b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nBad Header '
            + SECRET.encode() + b"\r\n\r\nxx\r\n--B--\r\n")
    answer = await _raw_http(server.url, b"POST /v1/audio/transcriptions HTTP/1.1\r\nHost: x\r\n"
                             b"Content-Type: multipart/form-data; boundary=B\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n" % len(form) + form)
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), answer
    message = json.loads(payload)["error"]["message"]
    assert message == "malformed multipart/form-data body: Invalid HTTP header", message  # not the raw bytes


PARTIAL_UPLOAD = (b'--B\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper-1\r\n'
                  b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                  b"Content-Type: audio/wav\r\n\r\nRIFF" + b"\x00" * 2000)  # ... and the rest never comes
LEAVING_MID_BODY = {path: ("application/json", b'{"sdp": ')
                    for path in ["/offer", "/api/sources", "/v1/chat/completions", "/v1/audio/speech"]}
for upload_path in ["/v1/audio/transcriptions", "/v1/audio/transcriptions/jobs"]:
    LEAVING_MID_BODY[upload_path] = ("multipart/form-data; boundary=B", PARTIAL_UPLOAD)


@pytest.mark.parametrize("path", sorted(LEAVING_MID_BODY))
async def test_a_client_leaving_mid_body_is_neither_a_500_nor_an_unhandled_error(vigil, caplog, tmp_path,
                                                                                path: str):
    caplog.set_level(logging.INFO)
    jobs = tmp_path / "jobs"
    server = await vigil(transcription={"data_dir": str(jobs)})
    before = _errors_500(await _exposition(server.url))
    content_type, partial = LEAVING_MID_BODY[path]
    await _raw_http(server.url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
                                f"Content-Length: {len(partial) + 100_000}\r\n\r\n".encode() + partial,
                    answer=False)
    async with asyncio.timeout(10):
        while "client left" not in caplog.text:  # noqa: ASYNC110 (the handler runs in this same loop)
            await asyncio.sleep(0.05)
    exposition = await _exposition(server.url)
    assert _errors_500(exposition) == before
    assert 'code="client_closed_request"' in exposition
    assert "unhandled error" not in caplog.text and "Traceback" not in caplog.text
    assert not list(jobs.rglob("*.part"))  # a job's half upload is not left on disk


CHAT = ("/v1/chat/completions", {"model": "any", "messages": [{"role": "user", "content": "hi"}]})
SPEECH = ("/v1/audio/speech", {"model": "tts-1", "input": "hi", "voice": "alloy"})


@pytest.mark.parametrize("route, field, value", [
    (CHAT, "max_tokens", "10"), (CHAT, "stream", "yes"), (CHAT, "stream", 1), (CHAT, "temperature", "0.5"),
    (CHAT, "n", 1.5), (CHAT, "seed", True), (CHAT, "logprobs", "true"),
    (CHAT, "stream_options", {"include_usage": "yes"}),
    (SPEECH, "speed", "1.5"), (SPEECH, "speed", True), (SPEECH, "speed", "2"),
], ids=lambda v: v[0].rsplit("/", 1)[1] if isinstance(v, tuple) else str(v))
async def test_loose_types_on_the_openai_routes_are_a_400_like_openai(vigil, route, field: str, value: object):
    server = await vigil()
    path, base = route
    body = {**base, field: value}
    if field == "stream_options":
        body["stream"] = True
    async with aiohttp.ClientSession() as http, http.post(server.url + path, json=body) as r:
        answer = await r.json()
    assert r.status == 400, answer
    assert answer["error"]["type"] == "invalid_request_error" and field in answer["error"]["param"]


async def test_a_rejected_data_channel_section_is_not_connectable(vigil):
    server = await vigil()
    sdp = _without(await _valid_offer_sdp(), "a=group:BUNDLE")  # unbundled: port 0 means rejected
    lines = [re.sub(r"^m=application \d+", "m=application 0", line) for line in sdp.splitlines()]
    status, body, _ = await _post_offer(server.url, "".join(line + "\r\n" for line in lines))
    assert status == 400 and body["error"]["code"] == "not_connectable" and "a port" in body["error"]["message"]


# ---------------------------------------------------------------- the HTTP layer: access log and framing

SECRET = "s3cret-do-not-log-0f9e"  # a test token: must appear in no log line nor answer


def _access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """Each access-log record as it would be written: the message and every structured field it carries."""
    return [record.getMessage() + " " + repr(vars(record)) for record in caplog.records
            if record.name == "aiohttp.access"]


async def test_the_token_in_a_query_never_reaches_the_access_log(vigil, caplog):
    caplog.set_level(logging.INFO, logger="aiohttp.access")  # `vigil serve` logs at INFO
    server = await vigil(auth={"token": SECRET})
    requests = [  # the dashboard's way (?token=, browsers cannot set headers there), spelled several ways
        (f"/api/sources?token={SECRET}", {}),
        (f"/api/sources?limit=5&%74oken={SECRET}", {}),  # aiohttp decodes the key: still the token
        ("/api/sources?api_key=" + SECRET, {"Authorization": f"Bearer {SECRET}", "Referer":
                                            f"http://127.0.0.1/?token={SECRET}#live"}),
    ]
    async with aiohttp.ClientSession() as http:
        for path, headers in requests:
            async with http.get(server.url + path, headers=headers) as response:
                assert response.status == 200, await response.text()
    async with asyncio.timeout(10):
        while len(_access_lines(caplog)) < len(requests):  # noqa: ASYNC110 (logged after the response is sent)
            await asyncio.sleep(0.05)
    lines = _access_lines(caplog)
    assert not [line for line in lines if SECRET in line], lines
    assert sum("GET /api/sources?token=***" in line for line in lines) == 1, lines  # logged, with its path
    assert any("?limit=5&" in line and "oken=***" in line for line in lines), lines
    assert any('"http://127.0.0.1/?token=***' in line for line in lines), lines  # the Referer


# Query keys that hold secrets in other APIs' spellings: each printed in clear before.
SECRET_LOOKING_KEYS = ["pw", "access_key", "passphrase", "private_key", "X-Amz-Signature", "X-Amz-Credential",
                       "sessionid", "client_secret", "refresh_token", "auth", "PHPSESSID", "sid", "apiKey"]


async def test_secret_looking_query_keys_never_reach_the_access_log(vigil, caplog):
    caplog.set_level(logging.INFO, logger="aiohttp.access")
    server = await vigil()
    query = "&".join(f"{key}={SECRET}-{index}" for index, key in enumerate(SECRET_LOOKING_KEYS))
    async with aiohttp.ClientSession() as http, http.get(
            f"{server.url}/api/sources?limit=5&{query}&keyword=door",
            headers={"Referer": f"http://127.0.0.1/?{query}"}) as response:
        assert response.status == 200, await response.text()
    async with asyncio.timeout(10):
        while not _access_lines(caplog):  # noqa: ASYNC110 (logged after the response is sent)
            await asyncio.sleep(0.05)
    (line,) = _access_lines(caplog)
    assert SECRET not in line, line
    for key in SECRET_LOOKING_KEYS:
        assert f"{key}=***" in line, (key, line)
    assert "limit=5&" in line and "keyword=door" in line, line  # everything else as it was asked


MALFORMED_FRAMING = {
    "content_length": b"GET /api/sources HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    "method": b"G@T / HTTP/1.1\r\nHost: x\r\n\r\n",
    "garbage": b"garbage\r\n\r\n",
    "header_value": b"GET / HTTP/1.1\r\nAuthorization: Bearer " + SECRET.encode() + b"\x01\r\n\r\n",
    "line_too_long": b"GET / HTTP/1.1\r\nX-Long: " + b"a" * 10_000 + b"\r\n\r\n",
    # a request line over aiohttp's 8190 bytes: its parser quotes it as bytearray(b'...')
    "request_line_too_long": (f"GET /api/sources?token={SECRET}&password={SECRET}&q=".encode() + b"a" * 9000
                              + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
    "request_line_too_long_get_first": (b"GET /api/sources?q=" + b"a" * 9000 + f"&token={SECRET}".encode()
                                        + b" HTTP/1.1\r\nHost: x\r\n\r\n"),
}


@pytest.mark.parametrize("framing", sorted(MALFORMED_FRAMING))
async def test_malformed_http_framing_is_a_json_400(vigil, caplog, framing: str):
    caplog.set_level(logging.INFO)
    server = await vigil()
    answer = await _raw_http(server.url, MALFORMED_FRAMING[framing])  # reads to EOF: the server closed
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0].endswith(b" 400 Bad Request"), answer
    assert b"Content-Type: application/json" in head, head
    body = json.loads(payload)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message"}, body
    assert body["error"]["code"] == "bad_request" and body["error"]["message"].startswith("malformed HTTP"), body
    # the parser quotes the raw bytes (a token in a header, too): neither the client nor the log sees them
    assert SECRET.encode() not in answer and SECRET not in caplog.text
    assert "Traceback" not in caplog.text and "malformed HTTP request" in caplog.text
    async with aiohttp.ClientSession() as http, http.get(server.url + "/healthz") as response:
        assert response.status == 200


async def test_vigil_serve_logs_requests_without_the_token_and_stops_gracefully_on_sigterm(tmp_path):
    """The production path end to end (``vigil serve`` at INFO, then SIGTERM), not only the shared helper."""
    config = {"voice": {"enabled": False}, "models": {"detector": {"backend": "none"}},
              "storage": {"data_dir": str(tmp_path / "data")}}
    server = VigilProcess(tmp_path, config, token=SECRET)  # the token by env, as a deployment gives it
    try:
        await asyncio.to_thread(server.start, 120)
        async with aiohttp.ClientSession() as http, http.get(
                f"{server.url}/api/sources?token={SECRET}") as response:
            assert response.status == 200
        answer = await _raw_http(server.url, MALFORMED_FRAMING["header_value"])
        assert b'"code": "bad_request"' in answer
    finally:
        status = await asyncio.to_thread(server.stop, 60)  # SIGTERM
    output = server.log(tail=0)
    assert status == 0, output
    assert "Running on" in output and "GET /api/sources?token=*** HTTP/1.1" in output, output
    assert SECRET not in output


async def test_an_error_past_every_middleware_is_a_json_500_without_a_traceback():
    """Vigil's apps catch everything in ``json_errors``; the protocol layer's own 500 is the last line behind it
    (an app without that middleware, served by the same helper)."""

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("internal detail " + SECRET)

    app = web.Application()
    app.router.add_get("/broken", broken)
    runner = await start_serving(app, "127.0.0.1", 0, shutdown_timeout=2.0)
    try:
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        async with aiohttp.ClientSession() as http, http.get(url + "/broken",
                                                             headers={"Accept": "text/html"}) as response:
            body = await response.text()
        assert response.status == 500 and response.content_type == "application/json", body
        assert json.loads(body) == {"error": {"code": "internal",
                                              "message": "internal server error; see the server log"}}
    finally:
        await runner.cleanup()


# ---------------------------------------------------------------- slow clients

HALF_OFFER_HEAD = b"POST /offer HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appli"  # half of /offer's headers
LIMITS = {"header_timeout_s": 1.0, "body_timeout_s": 1.0}


async def _connect(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def _until_closed(reader: asyncio.StreamReader, within: float) -> bytes:
    """All the server sends until it closes the connection (which it must do within ``within`` seconds)."""
    async with asyncio.timeout(within):
        return await reader.read()


def _json_error(answer: bytes) -> tuple[bytes, dict]:
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert b"Content-Type: application/json" in head, answer
    return head.split(b"\r\n")[0], json.loads(payload)


async def test_connections_that_send_half_their_headers_are_answered_408_and_closed(vigil):
    server = await vigil(server=LIMITS)
    connections = [await _connect(server.url) for _ in range(40)]
    for _, writer in connections:
        writer.write(HALF_OFFER_HEAD)
    started = asyncio.get_running_loop().time()
    answers = await asyncio.gather(*(_until_closed(reader, 8) for reader, _ in connections))
    waited = asyncio.get_running_loop().time() - started
    for _, writer in connections:
        writer.close()
    assert 0.8 < waited < 8, waited  # none before the limit, all soon after it
    for answer in answers:
        status, body = _json_error(answer)
        assert status == b"HTTP/1.1 408 Request Timeout" and body["error"]["code"] == "request_timeout", answer
    # A connection that says nothing at all is closed too (quietly); one that trickles a byte at a time as well.
    silent_reader, silent = await _connect(server.url)
    trickle_reader, trickle = await _connect(server.url)
    for byte in HALF_OFFER_HEAD[:6]:  # a byte each 0.1 s: the clock runs from the connection, not the last byte
        trickle.write(bytes([byte]))
        await asyncio.sleep(0.1)
    assert await _until_closed(silent_reader, 8) == b""
    status, _ = _json_error(await _until_closed(trickle_reader, 8))
    assert status.endswith(b" 408 Request Timeout")
    silent.close()
    trickle.close()
    # Clients that send whole requests are not affected: keep-alive requests, and a WebSocket kept past the limits.
    async with aiohttp.ClientSession() as http:
        for _ in range(3):
            async with http.get(server.url + "/healthz") as response:
                assert response.status == 200
            await asyncio.sleep(0.6)  # 1.8 s on one keep-alive connection, longer than header_timeout_s
        async with http.post(f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True}) as response:
            source = await response.json()
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            await asyncio.sleep(2.5)
            await ws.send_str(json.dumps({"v": 1, "type": "ping", "id": "late"}))
            async with asyncio.timeout(10):
                while (message := json.loads((await ws.receive()).data))["type"] != "pong":
                    pass
            assert message["id"] == "late"
        async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
            assert response.status == 204


async def test_a_body_sent_a_byte_at_a_time_gets_408_and_the_connection_is_closed(vigil):
    server = await vigil(server=LIMITS)
    body = json.dumps({"path": "long.mp4"}).encode()[:-1] + b" " * 600 + b"}"  # 100 B/s: 6 s to send it
    reader, writer = await _connect(server.url)
    writer.write(b"POST /api/sources HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))

    async def trickle() -> None:
        for byte in body[:-1]:  # never the last byte: the body is never complete
            writer.write(bytes([byte]))
            await asyncio.sleep(0.01)

    sender = asyncio.create_task(trickle())
    try:
        async with asyncio.timeout(8):
            head = await reader.readuntil(b"\r\n\r\n")
        # The client is still sending when the answer comes (as a browser uploading would be): the server reads
        # and drops those bytes before it closes, so the answer is read whole and the connection ends with EOF,
        # not a reset (CI once lost the answer to ECONNRESET when the server closed with bytes unread).
        await asyncio.sleep(0.3)
        answer = head + await _until_closed(reader, 8)
    finally:
        sender.cancel()
        writer.close()
    status, error = _json_error(answer)
    assert status == b"HTTP/1.1 408 Request Timeout" and error["error"]["code"] == "request_timeout", answer
    assert "body_timeout_s" in error["error"]["message"]
    async with aiohttp.ClientSession() as http, http.get(f"{server.url}/api/sources") as response:
        assert (await response.json())["sources"] == []  # nothing was started from half a body
    # A body longer than body_timeout_s at a fair rate (4 KB/s, over body_min_rate_bytes_s) is read and acted on.
    padded = body[:-1] + b" " * 12_000 + b"}"
    reader, writer = await _connect(server.url)
    writer.write(b"POST /api/sources HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(padded))
    for start in range(0, len(padded), 400):
        writer.write(padded[start:start + 400])
        await asyncio.sleep(0.1)
    answer = await _until_closed(reader, 10)
    writer.close()
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 201"), answer
    async with aiohttp.ClientSession() as http, http.delete(
            f"{server.url}/api/sources/{json.loads(payload)['id']}") as response:
        assert response.status == 204


async def test_one_address_holds_at_most_max_connections_per_address(vigil):
    server = await vigil(server={"max_connections_per_address": 5, "header_timeout_s": 30})
    held = [await _connect(server.url) for _ in range(5)]
    reader, extra = await _connect(server.url)
    status, body = _json_error(await _until_closed(reader, 8))
    extra.close()
    assert status == b"HTTP/1.1 429 Too Many Requests" and body["error"]["code"] == "too_many_connections", body
    for _, writer in held[:2]:  # two leave: two may come
        writer.close()
        await writer.wait_closed()
    async with asyncio.timeout(5):
        while True:
            answer = await _raw_http(server.url, b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if answer.startswith(b"HTTP/1.1 200"):
                break
            await asyncio.sleep(0.1)  # the server sees the close a moment later
    for _, writer in held[2:]:
        writer.close()
