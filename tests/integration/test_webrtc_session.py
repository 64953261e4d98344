"""A real aiortc client streams a generated file (video + audio) into /offer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
from aiortc.contrib.media import MediaPlayer

from server.cli.client import VigilClient
from server.media.jitter import DrainingDecoderQueue, DrainingJitterBuffer


def _session_tasks(session_id: str) -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(session_id) and not t.done()]


async def test_stream_file_gets_hello_and_counts_then_delete_frees_everything(vigil, clip_dir: Path):
    server = await vigil()
    player = MediaPlayer(str(clip_dir / "long.mp4"))
    client = VigilClient(server.url, options={"video": {"target_fps": 4}})
    session_id = await client.connect([player.video, player.audio])

    hello = await client.next_message("hello")
    assert hello["v"] == 1 and hello["session"] == session_id
    assert sorted(hello["tracks"]) == ["audio", "video"]
    assert hello["config"]["video"]["target_fps"] == 4
    assert isinstance(hello["ts"], float)

    metrics = await client.next_message(
        "metrics", where=lambda m: m["media"]["video"]["frames_in"] > 5 and m["media"]["audio"]["frames_in"] > 5
    )
    counts = metrics["media"]
    assert counts["video"]["frames_sampled"] <= counts["video"]["frames_in"]
    assert counts["audio"]["samples_in"] > 0
    # Inbound audio is released one packet after it arrives (server/media/jitter.py), not aiortc's four, and no
    # track keeps a backlog in its jitter buffer: this aiortc's receivers have the parts replaced.
    receivers = {r.track.kind: r for r in server.sessions.sessions[session_id].pc.getReceivers()}
    assert receivers["audio"]._RTCRtpReceiver__jitter_buffer._prefetch == 1
    for receiver in receivers.values():
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, DrainingJitterBuffer)
        assert isinstance(receiver._RTCRtpReceiver__decoder_queue, DrainingDecoderQueue)

    async with aiohttp.ClientSession() as http:
        async with http.get(f"{server.url}/api/sessions") as response:
            listed = await response.json()
        assert [s["id"] for s in listed["sessions"]] == [session_id]
        async with http.get(f"{server.url}/api/sessions/{session_id}") as response:
            info = await response.json()
        assert info["counts"]["video"]["frames_in"] > 0
        assert _session_tasks(session_id), "the session should own running tasks"
        async with http.get(f"{server.url}/metrics") as response:
            exposition = await response.text()
        assert "vigil_sessions 1.0" in exposition
        assert 'vigil_frames_total{kind="video",origin="webrtc",stage="in"}' in exposition
        assert 'vigil_messages_sent_total{type="hello"}' in exposition

        async with http.delete(f"{server.url}/api/sessions/{session_id}") as response:
            assert response.status == 204
        async with http.get(f"{server.url}/api/sessions/{session_id}") as response:
            assert response.status == 404
            assert (await response.json())["error"]["code"] == "not_found"

    final = await client.next_message("metrics", timeout=5)
    assert final["media"]["video"]["frames_in"] >= counts["video"]["frames_in"]
    await asyncio.sleep(0.2)
    assert _session_tasks(session_id) == []
    assert len(server.sessions) == 0
    await client.close(delete=False)
    player.video.stop()
    player.audio.stop()
