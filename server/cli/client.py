"""A WebRTC client for Vigil (used by ``vigil replay``, the tests and the benchmarks)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import aiohttp
from aiortc import MediaStreamTrack, RTCConfiguration, RTCPeerConnection, RTCSessionDescription

RESULTS_LABEL = "results"


class VigilError(Exception):
    def __init__(self, status: int, body: Any, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status, self.body, self.retry_after_s = status, body, retry_after_s


async def connect_when_admitted(connect: Callable[[], Awaitable[Any]], renew: Callable[[], None],
                                patience_s: float = 60.0) -> int:
    """``connect()`` until the server admits it: a 503 with Retry-After (a burst let in a few at a time, or a server
    at capacity) is waited out, and ``renew()`` makes a fresh peer connection (a refused one is closed) before the
    next try; anything else, or a wait past ``patience_s``, is raised. Returns how many 503s were waited out."""
    deadline = time.monotonic() + patience_s
    waited = 0
    while True:
        try:
            await connect()
            return waited
        except VigilError as error:
            wait = error.retry_after_s
            if error.status != 503 or wait is None or time.monotonic() + wait > deadline:
                raise
        waited += 1
        await asyncio.sleep(wait)
        renew()


class VigilClient:
    def __init__(self, base_url: str, token: str | None = None, options: dict[str, Any] | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.options = options
        self.session_id: str | None = None
        self.messages: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.on_message: Callable[[dict[str, Any], float], None] | None = None
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.channel = self.pc.createDataChannel(RESULTS_LABEL)
        self._channel_open = asyncio.Event()
        self._channel_closed = asyncio.Event()
        self.channel.on("open", self._channel_open.set)
        self.channel.on("close", self._channel_closed.set)
        self.channel.on("message", self._received)

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def _received(self, raw: str | bytes) -> None:
        arrived = time.perf_counter()
        message = json.loads(raw)
        if self.on_message is not None:
            self.on_message(message, arrived)
        else:  # queued only for next_message(); a callback consumer keeps memory flat on long runs
            self.messages.put_nowait(message)

    async def connect(self, tracks: Iterable[MediaStreamTrack] = (), timeout: float = 20.0) -> str:
        for track in tracks:
            self.pc.addTrack(track)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        body: dict[str, Any] = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        if self.options:
            body["options"] = self.options
        async with aiohttp.ClientSession() as http, http.post(
            f"{self.base_url}/offer", json=body, headers=self.headers
        ) as response:
            answer = await response.json()
            if response.status != 200:
                await self.pc.close()
                retry_after = response.headers.get("Retry-After")
                raise VigilError(response.status, answer,
                                 float(retry_after) if retry_after and retry_after.isdigit() else None)
        self.session_id = answer["session_id"]
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        await asyncio.wait_for(self._channel_open.wait(), timeout)
        return self.session_id

    def send(self, message: dict[str, Any] | str) -> None:
        self.channel.send(message if isinstance(message, str) else json.dumps(message))

    async def next_message(self, type_: str | None = None, timeout: float = 15.0,
                           where: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any]:
        """The next message (of ``type_``, matching ``where``), skipping others."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                raise TimeoutError(f"no {type_ or 'message'} within {timeout}s")
            message = await asyncio.wait_for(self.messages.get(), left)
            if (type_ is None or message.get("type") == type_) and (where is None or where(message)):
                return message

    async def close(self, delete: bool = True, grace: float = 3.0) -> None:
        """DELETE the session first, so the server can send its final counts, then hang up."""
        if delete and self.session_id is not None:
            with contextlib.suppress(aiohttp.ClientError):
                async with aiohttp.ClientSession() as http, http.delete(
                    f"{self.base_url}/api/sessions/{self.session_id}", headers=self.headers
                ):
                    pass
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._channel_closed.wait(), grace)
        await self.pc.close()


async def replay(path: str, url: str, token: str | None = None, options: dict[str, Any] | None = None,
                 emit: Callable[[dict[str, Any]], None] = lambda m: print(json.dumps(m), flush=True),
                 max_seconds: float | None = None) -> int:
    """Stream a media file into a running server in real time, passing each result to ``emit``."""
    from aiortc.contrib.media import MediaPlayer

    player = MediaPlayer(path)
    client = VigilClient(url, token, options)
    tracks = [t for t in (player.video, player.audio) if t is not None]
    if not tracks:
        raise ValueError(f"{path}: no audio or video stream")
    ended = asyncio.Event()
    remaining = {id(t) for t in tracks}

    def track_ended(track: MediaStreamTrack) -> None:
        remaining.discard(id(track))
        if not remaining:
            ended.set()

    for track in tracks:
        track.on("ended", lambda t=track: track_ended(t))
    count = 0

    def on_message(message: dict[str, Any], _: float) -> None:
        nonlocal count
        count += 1
        emit(message)

    client.on_message = on_message
    await client.connect(tracks)
    try:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(ended.wait(), max_seconds)
        await asyncio.sleep(1.0)  # results of the last frames are still in flight
    finally:
        await client.close()
    return count
