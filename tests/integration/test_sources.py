"""Server-side sources: files under the media root (both replay modes) and a real RTSP camera that drops."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp

from tests.support.ports import free_port
from tests.support.rtsp import RtspCamera


class Watcher:
    """A WebSocket subscriber on /api/sources/{id}/results."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.seen: list[dict[str, Any]] = []

    async def next(self, where: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
        async with asyncio.timeout(timeout):
            while True:
                msg = await self.ws.receive()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    raise AssertionError(f"socket ended ({msg.type}) while waiting; saw {self.seen[-5:]}")
                message = json.loads(msg.data)
                self.seen.append(message)
                if where(message):
                    return message

    async def state(self, state: str, timeout: float = 20.0) -> dict[str, Any]:
        return await self.next(lambda m: m["type"] == "event" and m["name"] == "source.state"
                               and m["data"]["state"] == state, timeout)


async def _post_source(http: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with http.post(f"{url}/api/sources", json=body) as response:
        data = await response.json()
        assert response.status == 201, data
        return data


async def test_file_source_realtime_streams_results_over_websocket(vigil):
    server = await vigil()
    async with aiohttp.ClientSession() as http:
        source = await _post_source(http, server.url, {"path": "clip.mp4", "name": "demo"})
        assert source["kind"] == "file" and source["location"] == "clip.mp4"
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            hello = await watcher.next(lambda m: m["type"] == "hello")
            assert hello["session"] == source["id"]
            await watcher.next(lambda m: m["type"] == "metrics" and m["media"]["video"]["frames_in"] > 0)
            ws_ping = {"v": 1, "type": "ping", "id": 1}
            await ws.send_str(json.dumps(ws_ping))
            await watcher.next(lambda m: m["type"] == "pong")
            await ws.send_str("{bad")
            assert (await watcher.next(lambda m: m["type"] == "error"))["code"] == "invalid_json"
            await watcher.state("ended")
            async with http.get(f"{server.url}/api/sources/{source['id']}") as response:
                info = await response.json()
            assert info["state"] == "ended"
            assert info["counts"]["video"]["frames_in"] == 30  # 2 s at 15 fps, every frame decoded
            assert info["counts"]["audio"]["seconds_in"] > 1.9
            async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
                assert response.status == 204
            await watcher.state("stopped")
            final = await watcher.next(lambda m: m["type"] == "metrics")
            assert final["media"]["video"]["frames_in"] == 30
            assert (await ws.receive(timeout=10)).type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
        async with http.get(f"{server.url}/api/sources") as response:
            assert (await response.json())["sources"] == []


async def test_file_source_as_fast_as_possible_analyses_every_sampled_frame(vigil):
    server = await vigil(video={"target_fps": 15})
    async with aiohttp.ClientSession() as http:
        source = await _post_source(http, server.url, {"path": "long.mp4", "realtime": False})
        for _ in range(100):
            async with http.get(f"{server.url}/api/sources/{source['id']}") as response:
                info = await response.json()
            if info["state"] == "ended":
                break
            await asyncio.sleep(0.1)
        video = info["counts"]["video"]
        assert info["state"] == "ended"
        assert video["frames_in"] == 90 and video["frames_sampled"] == 90
        assert video["frames_analyzed"] == 90 and video["frames_dropped"] == 0
        async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
            assert response.status == 204


async def test_rtsp_camera_drop_and_return_brings_the_source_back_live(vigil):
    server = await vigil()
    camera = RtspCamera(free_port(), audio=True)
    await asyncio.to_thread(camera.start)
    try:
        async with aiohttp.ClientSession() as http:
            source = await _post_source(http, server.url, {"url": camera.url})
            async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
                watcher = Watcher(ws)
                await watcher.state("live")
                await watcher.next(lambda m: m["type"] == "metrics" and m["media"]["video"]["frames_in"] > 5)

                await asyncio.to_thread(camera.stop)
                dropped = await watcher.state("reconnecting")
                assert dropped["data"]["attempt"] >= 1 and "retry_in_s" in dropped["data"]
                await asyncio.to_thread(camera.start)
                await watcher.state("live", timeout=30)
                before = (await watcher.next(lambda m: m["type"] == "metrics"))["media"]["video"]["frames_in"]
                await watcher.next(lambda m: m["type"] == "metrics" and m["media"]["video"]["frames_in"] > before)

                async with http.delete(f"{server.url}/api/sources/{source['id']}") as response:
                    assert response.status == 204
                await watcher.state("stopped")
    finally:
        await asyncio.to_thread(camera.stop)


async def test_a_source_can_be_stopped_while_it_cannot_connect(vigil):
    server = await vigil(sources={"reconnect_initial_s": 5.0, "reconnect_max_s": 10.0})
    async with aiohttp.ClientSession() as http:
        source = await _post_source(http, server.url, {"url": f"rtsp://127.0.0.1:{free_port()}/nothing"})
        async with http.ws_connect(f"{server.url}/api/sources/{source['id']}/results") as ws:
            watcher = Watcher(ws)
            await watcher.state("reconnecting")
            async with asyncio.timeout(3), http.delete(f"{server.url}/api/sources/{source['id']}") as response:
                assert response.status == 204
            await watcher.state("stopped")
    assert len(server.sources) == 0
