"""Fuzzing the server's inputs (hypothesis, bounded): data-channel and WebSocket messages against live sessions,
SDP mutations of a real offer against ``/offer``, REST and ``/v1`` bodies, multipart uploads.

Properties: never a 5xx; every error in the documented shape (``{"error": {"code", "message"}}``, OpenAI's
``{"error": {"message", "type", "param", "code"}}`` under ``/v1``); the session under attack and a bystander
keep answering ping -> pong; no asyncio task or file descriptor is left behind.

Each target is bounded by ``max_examples`` (scaled by ``VIGIL_FUZZ_SCALE``, default 1) so the file runs in about
two minutes on a 2-core machine. Inputs that once failed are kept as ``@example`` regression cases.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import wave
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from server.cli.client import VigilClient
from tests.integration.test_memory import _memory

SCALE = float(os.environ.get("VIGIL_FUZZ_SCALE", "1"))
EXAMPLES_RUN: Counter[str] = Counter()  # inputs per target, printed at the end (pytest -s)


def _bounded(examples: int) -> settings:
    return settings(max_examples=max(1, int(examples * SCALE)), deadline=20_000, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                           HealthCheck.data_too_large, HealthCheck.large_base_example])


@pytest.fixture(scope="module", autouse=True)
def _report_counts() -> Any:
    yield
    print("\nfuzz inputs per target:", dict(EXAMPLES_RUN))


# ---------------------------------------------------------------- leak accounting


def _open_fds() -> dict[str, str]:
    fds = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            fds[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed while listing
            pass
    return fds


def _live_tasks() -> set[asyncio.Task[Any]]:
    """Running tasks but the caller's own (a fixture's setup and teardown run in different tasks)."""
    return {task for task in asyncio.all_tasks() if not task.done() and task is not asyncio.current_task()}


@pytest.fixture
async def no_leaks() -> AsyncIterator[None]:
    """Requested after the harness: the counts with the harness up, before and after the fuzzing."""
    await asyncio.sleep(0.5)
    tasks, fds = _live_tasks(), _open_fds()
    yield
    try:
        async with asyncio.timeout(20):
            while len(_live_tasks()) > len(tasks) or len(_open_fds()) > len(fds):  # noqa: ASYNC110
                await asyncio.sleep(0.2)
    except TimeoutError:
        new_tasks = sorted(task.get_name() + ": " + repr(task.get_coro()) for task in _live_tasks() - tasks)
        new_fds = sorted(set(_open_fds().values()) - set(fds.values()))
        raise AssertionError(f"leaked {len(new_tasks)} tasks {new_tasks[:10]}, fds {new_fds[:10]}") from None


def _http() -> aiohttp.ClientSession:
    """No pooled connections: a kept-alive one would count as the server's open socket and handler task."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


# ---------------------------------------------------------------- strategies

JSON_SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=40)
JSON_VALUES = st.recursive(JSON_SCALARS, lambda inner: st.lists(inner, max_size=5)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=25)
ESCAPES = st.lists(st.sampled_from(["\\ud800", "\\udfff", "\\ud83d\\ude00", "\\u0000", "\\x41", "\\u12", "\\",
                                    '\\"', "\\uZZZZ", "\\/", "é", "a", "\\n"]), max_size=8).map("".join)
PROTOCOL_TYPES = st.sampled_from(["ping", "config", "hello", "dance", "", "PING"])


@st.composite
def deep_nesting(draw: st.DrawFn) -> str:
    depth = draw(st.integers(100, 5000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}"), ('{"v":1,"type":"config","video":', "}")]))
    inner = draw(st.sampled_from(["1", "[]", "{}", '"x"']))
    return opener * depth + inner + closer * depth


@st.composite
def protocol_shaped(draw: st.DrawFn) -> str:
    message: dict[str, Any] = {"v": draw(st.sampled_from([1, 2, "1", None])), "type": draw(PROTOCOL_TYPES)}
    message.update(draw(st.dictionaries(st.sampled_from(["id", "video", "voice", "zones", "target_fps", "x"]),
                                        JSON_VALUES, max_size=3)))
    return json.dumps(message)


CLIENT_MESSAGES = st.one_of(
    JSON_VALUES.map(json.dumps),
    protocol_shaped(),
    ESCAPES.map(lambda s: '{"v":1,"type":"ping","id":"' + s + '"}'),
    ESCAPES.map(lambda s: '{"v":1,"type":"' + s + '"}'),
    deep_nesting(),
    st.integers(60_000, 200_000).map(lambda n: '"' + "x" * n + '"'),  # around and over the 64 KiB limit
    st.text(max_size=200),
)


# ---------------------------------------------------------------- data channel and WebSocket


@dataclass
class Sessions:
    server: Any
    victim: VigilClient
    bystander: VigilClient
    source_id: str
    http: aiohttp.ClientSession
    ws: aiohttp.ClientWebSocketResponse
    sent: int = 0


@pytest.fixture
async def sessions(vigil) -> AsyncIterator[Sessions]:
    server = await vigil(webrtc={"offer_rate_limit": None})
    victim, bystander = VigilClient(server.url), VigilClient(server.url)
    await victim.connect()
    await bystander.connect()
    http = _http()
    async with http.post(f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True}) as response:
        source = await response.json()
    ws = await http.ws_connect(f"{server.url}/api/sources/{source['id']}/results")
    yield Sessions(server, victim, bystander, source["id"], http, ws)
    await ws.close()
    async with http.delete(f"{server.url}/api/sources/{source['id']}"):
        pass
    await http.close()
    await victim.close()
    await bystander.close()


SERVER_TYPES = {"hello", "detections", "transcript", "reply", "event", "metrics", "error", "pong"}


def _check_server_message(message: dict[str, Any]) -> None:
    assert message.get("type") in SERVER_TYPES, message
    if message["type"] == "error":
        assert isinstance(message["code"], str) and isinstance(message["message"], str), message


async def _pong_after(client: VigilClient, marker: str) -> None:
    """Every message up to the pong that answers ``marker`` is well formed (the channel is ordered)."""
    client.send({"v": 1, "type": "ping", "id": marker})
    while True:
        message = await client.next_message(timeout=15)
        _check_server_message(message)
        if message["type"] == "pong" and message.get("id") == marker:
            return


async def _ws_pong_after(ws: aiohttp.ClientWebSocketResponse, marker: str) -> None:
    await ws.send_str(json.dumps({"v": 1, "type": "ping", "id": marker}))
    async with asyncio.timeout(15):
        while True:
            frame = await ws.receive()
            assert frame.type == aiohttp.WSMsgType.TEXT, f"the subscriber was closed: {frame}"
            message = json.loads(frame.data)
            _check_server_message(message)
            if message["type"] == "pong" and message.get("id") == marker:
                return


@_bounded(250)
@given(raw=CLIENT_MESSAGES)
@example(raw='{"v":1,"type":"ping","id":"\\ud800"}')  # the pong could not be serialised
@example(raw="[" * 2000 + "]" * 2000)  # RecursionError escaped the data-channel callback
@example(raw='{"v":1,"type":"\\udfff"}')
async def test_fuzz_client_messages_never_end_a_session_or_subscriber(sessions: Sessions, no_leaks: None,
                                                                      raw: str) -> None:
    EXAMPLES_RUN["data channel + WebSocket messages"] += 1
    sessions.sent += 1
    marker = f"fuzz-{sessions.sent}"
    sessions.victim.send(raw)
    await _pong_after(sessions.victim, marker)
    if len(raw) <= 4 * 64 * 1024:  # larger frames are closed by the WebSocket protocol itself (1009)
        await sessions.ws.send_str(raw)
        await _ws_pong_after(sessions.ws, marker)
    await _pong_after(sessions.bystander, marker)
    assert sessions.victim.pc.connectionState == "connected"
    assert sessions.victim.session_id in sessions.server.sessions.sessions


@_bounded(60)
@given(raw=st.binary(max_size=300))
async def test_fuzz_binary_data_channel_messages(sessions: Sessions, no_leaks: None, raw: bytes) -> None:
    EXAMPLES_RUN["data channel binary messages"] += 1
    sessions.sent += 1
    sessions.victim.channel.send(raw)
    await _pong_after(sessions.victim, f"bin-{sessions.sent}")


# ---------------------------------------------------------------- SDP mutations against /offer

INTERESTING_SDP_LINES = [
    "a=group:BUNDLE 7 0", "a=group:BUNDLE 0 0", "a=group:BUNDLE", "a=mid:", "a=mid:7", "a=setup:bogus",
    "a=fingerprint:sha-256 00", "a=fingerprint:md5 AA:BB", "a=ice-ufrag:", "a=ice-pwd:x", "a=ice-lite",
    "m=application 0 UDP/DTLS/SCTP webrtc-datachannel", "m=application 9 UDP/DTLS/SCTP x",
    "m=video 9 UDP/TLS/RTP/SAVPF 96", "m=audio 9 UDP/TLS/RTP/SAVPF 300", "a=rtpmap:96 VP8/90000",
    "a=rtpmap:96 H264/0", "a=sctp-port:99999", "a=sctp-port:x", "a=max-message-size:-1", "a=ssrc:abc cname:x",
    "a=ssrc-group:FID 1", "a=rtcp-mux", "a=extmap:99 urn:x", "c=IN IP6 ::1", "c=IN IP4 999.1.1.1", "a=sendonly",
    "a=candidate:1 1 UDP 1 127.0.0.1 9 typ host", "a=candidate:garbage", "a=msid:- -", "a=rtcp-fb:96 nack",
    "a=fmtp:96 apt=300", "t=x", "v=1", "o=- x x IN IP4 0", "m=", "a=", "",
]


@st.composite
def sdp_mutations(draw: st.DrawFn, base: list[str]) -> str:
    lines = list(base)
    for _ in range(draw(st.integers(1, 4))):
        operation = draw(st.sampled_from(["delete", "insert", "replace", "duplicate", "truncate", "mutate"]))
        index = draw(st.integers(0, max(len(lines) - 1, 0)))
        payload = draw(st.sampled_from(INTERESTING_SDP_LINES) | st.text(max_size=40).filter(
            lambda s: "\r" not in s and "\n" not in s))
        if not lines:
            lines = [payload]
        elif operation == "delete":
            del lines[index]
        elif operation == "insert":
            lines.insert(index, payload)
        elif operation == "replace":
            lines[index] = payload
        elif operation == "duplicate":
            lines.insert(index, lines[index])
        elif operation == "truncate":
            lines = lines[:index]
        else:
            line = lines[index]
            at = draw(st.integers(0, len(line)))
            lines[index] = line[:at] + draw(st.text(max_size=3)) + line[at + 1:]
    return "".join(line + "\r\n" for line in lines)


@pytest.fixture
async def offer_target(vigil) -> AsyncIterator[tuple[Any, list[str], aiohttp.ClientSession]]:
    server = await vigil(webrtc={"offer_rate_limit": None})
    client = VigilClient(server.url)
    client.pc.addTransceiver("video")
    client.pc.addTransceiver("audio")
    await client.pc.setLocalDescription(await client.pc.createOffer())
    base = client.pc.localDescription.sdp.splitlines()
    await client.pc.close()
    async with _http() as http:
        yield server, base, http


def _vigil_error_shape(body: Any) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert isinstance(body["error"]["code"], str) and isinstance(body["error"]["message"], str), body


def _openai_error_shape(body: Any) -> None:
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    assert isinstance(body["error"]["message"], str) and isinstance(body["error"]["type"], str), body


@_bounded(150)
@given(data=st.data())
async def test_fuzz_sdp_mutations_never_a_5xx_nor_a_held_slot(offer_target, no_leaks: None,
                                                              data: st.DataObject) -> None:
    server, base, http = offer_target
    EXAMPLES_RUN["SDP mutations on /offer"] += 1
    sdp = data.draw(sdp_mutations(base))
    async with http.post(f"{server.url}/offer", json={"sdp": sdp, "type": "offer"}) as response:
        body = await response.json()
    assert response.status in (200, 400, 413, 422), (response.status, body, sdp)
    if response.status == 200:
        async with http.delete(f"{server.url}/api/sessions/{body['session_id']}") as deleted:
            assert deleted.status in (204, 404)  # 404: ICE already failed (e.g. a mangled candidate), closed
    else:
        _vigil_error_shape(body)
    assert server.sessions.occupied == 0


# ---------------------------------------------------------------- REST and /v1 bodies

JSON_ROUTES = {
    "/offer": {"sdp": "v=0", "type": "offer", "options": {"video": {"target_fps": 2}}},
    "/api/sources": {"url": "rtsp://127.0.0.1:9/cam", "name": "x", "realtime": True, "loop": False},
    "/api/sessions/{session}/config": {"video": {"target_fps": 3}},
    "/api/sources/{source}/config": {"video": {"target_fps": 3}},
    "/v1/chat/completions": {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}],
                             "max_tokens": 5, "stream": False, "temperature": 0.5},
    "/v1/audio/speech": {"model": "no-such-model", "input": "hi", "voice": "alloy", "response_format": "wav"},
    "/v1/audio/transcriptions": {"model": "whisper-1"},
    "/api/collections/{collection}/documents": {"name": "manual", "text": "The pump is in room 4.",
                                                "format": "markdown"},
}


@st.composite
def near_valid(draw: st.DrawFn, template: dict[str, Any]) -> Any:
    body = json.loads(json.dumps(template))
    for _ in range(draw(st.integers(1, 3))):
        key = draw(st.sampled_from([*body, "extra"]))
        if draw(st.booleans()):
            body.pop(key, None)
        else:
            body[key] = draw(JSON_VALUES)
    return body


@st.composite
def http_bodies(draw: st.DrawFn) -> tuple[str, str, bytes]:
    path = draw(st.sampled_from(sorted(JSON_ROUTES)))
    kind = draw(st.sampled_from(["near", "near", "json", "deep", "bytes", "text"]))
    if kind == "near":
        raw = json.dumps(draw(near_valid(JSON_ROUTES[path]))).encode()
    elif kind == "json":
        raw = json.dumps(draw(JSON_VALUES)).encode()
    elif kind == "deep":
        raw = draw(deep_nesting()).encode()
    elif kind == "bytes":
        raw = draw(st.binary(max_size=200))
    else:
        raw = draw(st.text(max_size=200)).encode("utf-8")
    content_type = draw(st.sampled_from(["application/json", "application/json", "text/plain",
                                         "multipart/form-data; boundary=x", "application/json; charset=latin-1",
                                         "application/x-www-form-urlencoded"]))
    return path, content_type, raw


@pytest.fixture
async def rest_target(vigil, tmp_path: Path) -> AsyncIterator[tuple[Any, dict[str, str], aiohttp.ClientSession]]:
    server = await vigil(webrtc={"offer_rate_limit": None}, api={"rate_limit": None},
                         transcription={"data_dir": str(tmp_path / "jobs")}, memory=_memory(tmp_path))
    client = VigilClient(server.url)
    ids = {"session": await client.connect(), "collection": "fuzz"}
    async with _http() as http:
        async with http.post(f"{server.url}/api/sources", json={"path": "long.mp4", "loop": True}) as response:
            ids["source"] = (await response.json())["id"]
        async with http.get(f"{server.url}/v1/audio/transcriptions/jobs") as response:
            assert response.status == 200  # the job queue (its worker, its database) opens on first use
        speech = {**JSON_ROUTES["/v1/audio/speech"], "model": "tts-1"}
        async with http.post(f"{server.url}/v1/audio/speech", json=speech) as response:
            assert response.status == 200  # ... and the speech model (onnxruntime keeps files open)
        document = JSON_ROUTES["/api/collections/{collection}/documents"]
        async with http.post(f"{server.url}/api/collections/fuzz/documents", json=document) as response:
            assert response.status == 201  # ... and the memory index's files
        yield server, ids, http
        async with http.delete(f"{server.url}/api/sources/{ids['source']}"):
            pass
    await client.close()


async def _stop_created_source(http: aiohttp.ClientSession, url: str, path: str, status: int, body: Any) -> None:
    if path == "/api/sources" and status == 201:
        async with http.delete(f"{url}/api/sources/{body['id']}") as response:
            assert response.status == 204


@_bounded(300)
@given(request=http_bodies())
@example(request=("/v1/chat/completions", "application/json", b'{"model":"m","messages":[],"max_tokens":"10"}'))
@example(request=("/v1/chat/completions", "application/json", b'{"model":"m","messages":[],"stream":"yes"}'))
@example(request=("/api/sources", "application/json", b'{"url":"  rtsp://127.0.0.1:9/cam"}'))
@example(request=("/offer", "application/json", b"[" * 3000 + b"]" * 3000))
@example(request=("/api/collections/{collection}/documents", "application/json", b"[" * 3000 + b"]" * 3000))
async def test_fuzz_rest_and_v1_bodies_get_documented_4xx_errors(rest_target, no_leaks: None,
                                                                 request: tuple[str, str, bytes]) -> None:
    server, ids, http = rest_target
    path, content_type, raw = request
    EXAMPLES_RUN["REST and /v1 JSON bodies"] += 1
    url = server.url + path.format(**ids)
    async with http.post(url, data=raw, headers={"Content-Type": content_type}) as response:
        text = await response.text()
    assert response.status < 500, (response.status, text, request)
    body = json.loads(text) if response.content_type == "application/json" else None
    await _stop_created_source(http, server.url, path, response.status, body)
    if response.status >= 400:
        (_openai_error_shape if path.startswith("/v1/") else _vigil_error_shape)(body)
    assert len(server.sessions) == 1 and ids["session"] in server.sessions.sessions  # never touched


# ---------------------------------------------------------------- multipart uploads


def _tiny_wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(16000)
        wav.writeframes(b"\x00\x00" * 3200)
    return out.getvalue()


TINY_WAV = _tiny_wav()
PART_NAMES = st.sampled_from(["file", "model", "language", "prompt", "response_format", "temperature",
                              "timestamp_granularities[]", "stream", "nope", ""])


@st.composite
def multipart_bodies(draw: st.DrawFn) -> tuple[str, str, bytes]:
    boundary = draw(st.sampled_from(["B", "x" * 70, "b-ö", ""]))
    declared = boundary if draw(st.integers(0, 9)) else draw(st.sampled_from(["other", ""]))
    chunks: list[bytes] = []
    for _ in range(draw(st.integers(0, 4))):
        name = draw(PART_NAMES)
        headers = [f'Content-Disposition: form-data; name="{name}"'
                   + (f'; filename="{draw(st.text(max_size=10))}"' if name == "file" else "")]
        headers += draw(st.lists(st.sampled_from(["Content-Type: audio/wav", "Bad Header", "X: \x00",
                                                 "Content-Transfer-Encoding: base64", "Content-Length: -1",
                                                 "Content-Disposition: attachment"]), max_size=2))
        if name == "file":
            content = draw(st.sampled_from([TINY_WAV, TINY_WAV[:50], b"", b"RIFF"]) | st.binary(max_size=300))
        elif name == "model":
            content = draw(st.sampled_from([b"whisper-1", b"", b"no-such"]))
        else:
            content = draw(st.binary(max_size=40))
        newline = draw(st.sampled_from(["\r\n", "\n"]))
        chunks.append(f"--{boundary}{newline}{newline.join(headers)}{newline}{newline}".encode("utf-8", "replace")
                      + content + newline.encode())
    if draw(st.booleans()):
        chunks.append(f"--{boundary}--\r\n".encode())
    path = draw(st.sampled_from(["/v1/audio/transcriptions", "/v1/audio/transcriptions/jobs"]))
    return path, f"multipart/form-data; boundary={declared}", b"".join(chunks)


@_bounded(120)
@given(upload=multipart_bodies())
@example(upload=("/v1/audio/transcriptions", "multipart/form-data; boundary=B",
                 b'--B\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\nBad Header\r\n\r\nxx\r\n'
                 b"--B--\r\n"))  # aiohttp's InvalidHeader was a 500
async def test_fuzz_multipart_uploads_get_documented_4xx_errors(rest_target, no_leaks: None,
                                                                upload: tuple[str, str, bytes]) -> None:
    server, _, http = rest_target
    path, content_type, raw = upload
    EXAMPLES_RUN["multipart uploads"] += 1
    async with http.post(server.url + path, data=raw, headers={"Content-Type": content_type}) as response:
        text = await response.text()
    assert response.status < 500, (response.status, text, upload)
    if response.status >= 400:
        _openai_error_shape(json.loads(text))
