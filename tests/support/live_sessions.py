"""Browser-like live sessions for survival checks: each a camera (pre-encoded VP8 640x480 at 30 fps, looped real
images, so the detector finds people and no client-side encoding stands in for the server's limits) and a
microphone (low noise, Opus-encoded by aiortc as a browser would), pinging the server every second.

Run as a process of its own (``python -m tests.support.live_sessions --url URL --sessions N --seconds S``), so the
clients' work does not share the caller's event loop: prints one JSON line with each session's fate."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import time
from typing import Any

from server.cli.client import VigilClient, VigilError, connect_when_admitted
from server.media.ice import restrict_host_addresses
from tests.support.audio import ScriptedMicrophone
from tests.support.media import PrecodedVideoTrack, precoded_vp8

CAMERA_FPS = 30
SIZE = (640, 480)


class LiveSession:
    """One session: camera + microphone; counts detections and pongs, notes when and why it ended."""

    def __init__(self, url: str, packets: list[bytes]) -> None:
        self.url, self.packets = url, packets
        self.detections: list[float] = []
        self.pings: dict[str, float] = {}
        self.round_trips: list[float] = []
        self.ended_at: float | None = None
        self.ended_why = ""
        self.busy_answers = 0  # 503s waited out (Retry-After) before the session was admitted
        self._new_peer()

    def _new_peer(self) -> None:
        self.camera = PrecodedVideoTrack(self.packets, CAMERA_FPS)
        self.microphone = ScriptedMicrophone(noise=30.0)
        self.client = VigilClient(self.url)
        self.client.on_message = self._received
        self.client.pc.on("connectionstatechange", self._state)

    def _state(self) -> None:
        state = self.client.pc.connectionState
        if state in ("failed", "closed") and self.ended_at is None:
            self.ended_at, self.ended_why = time.perf_counter(), f"connection {state}"

    def _received(self, message: dict[str, Any], at: float) -> None:
        if message.get("type") == "detections":
            self.detections.append(at)
        elif message.get("type") == "pong" and message.get("id") in self.pings:
            self.round_trips.append((at - self.pings.pop(message["id"])) * 1000.0)

    async def open(self, patience_s: float = 0.0) -> None:
        """Connect; a 503 with Retry-After is waited out and tried again, as a browser client would, for up to
        ``patience_s`` (0: the first answer stands)."""

        def renew() -> None:
            self.ended_at, self.ended_why = None, ""  # the refused peer connection's close was no session's end
            self.camera.stop()
            self.microphone.stop()
            self._new_peer()

        self.busy_answers += await connect_when_admitted(
            lambda: self.client.connect([self.camera, self.microphone]), renew, patience_s)

    async def ping_forever(self) -> None:
        count = 0
        while self.ended_at is None:
            await asyncio.sleep(1.0)
            if self.client.channel.readyState != "open":
                self.ended_at, self.ended_why = time.perf_counter(), "data channel closed"
                return
            count += 1
            self.pings[str(count)] = time.perf_counter()
            with contextlib.suppress(Exception):
                self.client.send({"type": "ping", "id": str(count)})

    @property
    def alive(self) -> bool:
        return (self.ended_at is None and self.client.pc.connectionState == "connected"
                and self.client.channel.readyState == "open")

    def report(self, started: float, ended: float) -> dict[str, Any]:
        until = self.ended_at or ended
        detections = sum(1 for t in self.detections if started <= t < until)
        return {"alive": self.alive, "lived_s": round(until - started, 1), "why": self.ended_why,
                "busy_answers": self.busy_answers,
                "detections_per_s": detections / max(until - started, 1e-9), "pongs": len(self.round_trips),
                "ping_p95_ms": (statistics.quantiles(self.round_trips, n=20)[-1] if len(self.round_trips) >= 2
                                else None)}

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close(grace=1.0)
        self.camera.stop()
        self.microphone.stop()


async def run_sessions(url: str, count: int, seconds: float, extra: bool) -> dict[str, Any]:
    """``count`` sessions for ``seconds``; with ``extra``, one more offer halfway (its answer is reported)."""
    restrict_host_addresses(["127.0.0.1"])
    packets = precoded_vp8(SIZE, CAMERA_FPS)
    sessions = [LiveSession(url, packets) for _ in range(count)]
    refused: list[str] = []
    for session in sessions:
        try:
            await session.open(patience_s=60.0)  # a burst is let in a few at a time (sessions.max_starting_sessions)
        except (TimeoutError, VigilError) as error:
            refused.append(str(error)[:200])
            session.ended_at, session.ended_why = time.perf_counter(), f"refused: {str(error)[:120]}"
    started = time.perf_counter()
    pingers = [asyncio.create_task(s.ping_forever()) for s in sessions if s.ended_at is None]
    extra_answer, extra_session = "not tried", None
    if extra:
        await asyncio.sleep(seconds / 2)
        extra_session = LiveSession(url, packets)
        try:
            await extra_session.open()
            extra_answer = "admitted"
        except VigilError as error:
            extra_answer = f"HTTP {error.status} {json.dumps(error.body)[:160]}"
        except TimeoutError:
            extra_answer = "admitted but never connected"
        await asyncio.sleep(seconds / 2)
    else:
        await asyncio.sleep(seconds)
    ended = time.perf_counter()
    result = {"sessions": [s.report(started, ended) for s in sessions], "refused": refused, "extra": extra_answer}
    for task in pingers:
        task.cancel()
    everyone = [*sessions, *([extra_session] if extra_session else [])]
    await asyncio.gather(*(s.close() for s in everyone), return_exceptions=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--sessions", type=int, required=True)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--extra", action="store_true", help="offer one more session halfway")
    opts = parser.parse_args()
    print(json.dumps(asyncio.run(run_sessions(opts.url, opts.sessions, opts.seconds, opts.extra))), flush=True)


if __name__ == "__main__":
    main()
