"""One browser-like live session (``tests.support.live_sessions``: camera + microphone, pinging every second) that
floods its data channel with garbage, while the server's ``vigil_media_delay_seconds`` is read every half second.

Run as a process of its own (``python -m tests.support.flood_session --url URL``), so the clients' work does not
share the server's or the caller's event loop: prints one JSON line with the session's fate, how many garbage
messages were answered with an error, and the delay samples ``[seconds since the flood began, delay]``."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import time
from typing import Any

import aiohttp

from server.media.ice import restrict_host_addresses
from tests.support.live_sessions import CAMERA_FPS, LiveSession
from tests.support.media import precoded_vp8

# A small picture: VP8 frames of one RTP packet each, as a low-bitrate browser camera sends (a backlog of such
# frames in aiortc's jitter buffer never shrinks by itself).
SIZE = (160, 120)


def garbage(index: int) -> str | bytes:
    """Four kinds in turn, each refused by the server with an ``error``: binary, a type that is no message type
    (echoed back as ``ref``), text that is no JSON, a valid-JSON config with fields no config has."""
    rng = random.Random(index)
    match index % 4:
        case 0:
            return os.urandom(rng.randint(1000, 60000))
        case 1:
            return json.dumps({"type": "x" * rng.randint(30000, 60000)})
        case 2:
            return "not json " * rng.randint(10, 5000)
        case _:
            return json.dumps({"type": "config", "video": {"zones": [{"x": "y" * 50} for _ in range(800)]}})


async def media_delay(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(f"{url}/metrics") as response:
        text = await response.text()
    found = re.search(r"^vigil_media_delay_seconds ([0-9.e+-]+)$", text, re.M)
    return float(found.group(1)) if found else float("nan")


async def run(url: str, messages: int, before_s: float, after_s: float) -> dict[str, Any]:
    restrict_host_addresses(["127.0.0.1"])
    session = LiveSession(url, precoded_vp8(SIZE, CAMERA_FPS))
    errors: list[str] = []
    counted = session._received

    def received(message: dict[str, Any], at: float) -> None:
        if message.get("type") == "error":
            errors.append(message.get("code", ""))
        counted(message, at)

    session.client.on_message = received
    await session.open(patience_s=30.0)
    pinger = asyncio.create_task(session.ping_forever())
    samples: list[tuple[float, float]] = []
    flood_at = time.perf_counter() + before_s
    async with aiohttp.ClientSession() as http:
        async def sample() -> None:
            while True:
                samples.append((round(time.perf_counter() - flood_at, 2), await media_delay(http, url)))
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample())
        await asyncio.sleep(before_s)
        for index in range(messages):  # as fast as the channel takes them: the burst that overflows the socket
            session.client.channel.send(garbage(index))
        await asyncio.sleep(after_s)  # the answers and the media delay, watched from the flood on
        sampler.cancel()
    pinger.cancel()
    result = {"alive": session.alive, "messages": messages, "errors": len(errors), "error_codes": sorted(set(errors)),
              "pongs": len(session.round_trips), "samples": samples}
    await session.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--messages", type=int, default=750)
    parser.add_argument("--before-s", type=float, default=4.0, help="media flowing before the flood")
    parser.add_argument("--after-s", type=float, default=20.0, help="watched after the flood began")
    opts = parser.parse_args()
    print(json.dumps(asyncio.run(run(opts.url, opts.messages, opts.before_s, opts.after_s))), flush=True)


if __name__ == "__main__":
    main()
