"""Do admitted audio+video sessions survive? N live WebRTC sessions, each a camera and a microphone, held for a
minute against one ``vigil serve`` (default config), counted at the client.

Each session is what a browser tab sends (tests/support/live_sessions.py): a camera (pre-encoded VP8 640x480 at
30 fps, looped real images, so the detector finds people, and no client-side encoding stands in for the server's
limits) and a microphone (low noise, Opus-encoded by aiortc as a browser would). All sessions run in one child
process; this process watches the server. Per step the bench reports, from the clients: sessions admitted and
alive at the end (connection ``connected``, data channel open), when and why any ended or was refused, results
(``detections``) per second per session, and the p95 round trip of a data-channel ping; halfway through, one more
offer (past capacity it must be refused with 503 + Retry-After while the running ones live on). From the server,
to explain them: its CPU share, its event-loop thread's share (``vigil_event_loop_load``), how late live media
reaches it (``vigil_media_delay_seconds``), its event-loop lag and its UDP receive queues.

    make bench BENCH=survival ARGS="--sessions 4,8 --seconds 60"
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from bench.capacity import cpu_seconds, export_revision, lag_since, loop_lag
from tests.support.live_sessions import CAMERA_FPS, SIZE
from tests.support.vigil_process import REPO_ROOT, VigilProcess


async def gauges(url: str, *names: str) -> list[float]:
    """The server's current values of the named Prometheus gauges (0 when absent)."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    values = {family.name: sample.value for family in text_string_to_metric_families(text)
              for sample in family.samples}
    return [values.get(name, 0.0) for name in names]


def udp_receive_queues(pid: int) -> int:
    """Bytes waiting in the server's UDP sockets (its ICE transports), from /proc/net/udp."""
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    total = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            total += int(fields[4].split(":")[1], 16)
    return total


async def step(server: VigilProcess, count: int, seconds: float) -> dict[str, Any]:
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.support.live_sessions", "--url", server.url, "--sessions", str(count),
        "--seconds", str(seconds), "--extra", stdout=subprocess.PIPE, cwd=REPO_ROOT)
    pid = server.process.pid  # type: ignore[union-attr]
    lag_before, cpu_before, wall_before = await loop_lag(server.url), cpu_seconds(pid), time.monotonic()
    queues: list[int] = []
    loads: list[float] = []
    delays: list[float] = []
    reading = asyncio.ensure_future(child.stdout.readline())  # type: ignore[union-attr]
    while not reading.done():
        queues.append(udp_receive_queues(pid))
        load, delay = await gauges(server.url, "vigil_event_loop_load", "vigil_media_delay_seconds")
        loads.append(load)
        delays.append(delay)
        await asyncio.wait([reading], timeout=2.0)
    await child.wait()
    result = json.loads(reading.result())
    result["lag"] = lag_since(lag_before, await loop_lag(server.url))
    result["cpu"] = (cpu_seconds(pid) - cpu_before) / (time.monotonic() - wall_before)
    result["udp_queue_max"] = max(queues, default=0)
    result["loop_load"] = (statistics.median(loads), max(loads)) if loads else (0.0, 0.0)
    result["media_delay"] = (statistics.median(delays), max(delays)) if delays else (0.0, 0.0)
    return result


def checkouts(specs: list[str], workdir: Path) -> list[tuple[Path, str]]:
    """What to serve: ``--vigil-root`` DIR or DIR@REV (a commit of this checkout, served from an export)."""
    roots = [(REPO_ROOT, "this checkout")]
    for spec in specs:
        roots.append(export_revision(spec.split("@", 1)[1], workdir) if "@" in spec else (Path(spec).resolve(), spec))
    return roots


async def main(opts: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="vigil-survival-"))
    roots = await asyncio.to_thread(checkouts, opts.vigil_root, workdir)
    for root, label in reversed(roots):  # the other revisions first, this checkout last
        await serve_steps(opts, workdir, root, label)


async def serve_steps(opts: argparse.Namespace, workdir: Path, root: Path, label: str) -> None:
    levels = [int(n) for n in opts.sessions.split(",")]
    config: dict[str, Any] = {"webrtc": {"host_addresses": ["127.0.0.1"], "offer_rate_limit": None},
                              "grpc": {"port": 0}, "memory": {}}  # {}: the default memory section, as served
    server = await asyncio.to_thread(VigilProcess(workdir, config, root=root).start)
    print(f"\nvigil serve ({label}, default config) at {server.url}; each session: VP8 {SIZE[0]}x{SIZE[1]} at "
          f"{CAMERA_FPS} fps (pre-encoded) + a microphone (Opus, low noise), {opts.seconds:g} s, all clients in one "
          "child process")
    print(f"{'sessions':>8} {'alive':>6} {'detections/s per session (min..max)':>38} {'ping p95 ms':>12}  "
          "one more offer mid-run")
    largest = 0
    try:
        for count in levels:
            result = await step(server, count, opts.seconds)
            sessions = result["sessions"]
            alive = sum(1 for s in sessions if s["alive"])
            rates = [s["detections_per_s"] for s in sessions]
            pings = [s["ping_p95_ms"] for s in sessions if s["ping_p95_ms"] is not None]
            print(f"{count:>8} {alive:>3}/{count:<2} {min(rates):>28.2f} .. {max(rates):<6.2f} "
                  f"{max(pings) if pings else float('nan'):>12.0f}  {result['extra']}", flush=True)
            for index, s in enumerate(sessions):
                if not s["alive"]:
                    print(f"{'':>10}session {index}: ended after {s['lived_s']} s ({s['why']})")
            print(f"{'':>10}server: CPU {result['cpu']:.0%} of one core; its event-loop thread "
                  f"{result['loop_load'][0]:.0%} (median; max {result['loop_load'][1]:.0%}) of one core; media delay "
                  f"{result['media_delay'][0]:.2f} s (median; max {result['media_delay'][1]:.2f} s); event-loop "
                  f"lag {result['lag']}; UDP receive queues up to {result['udp_queue_max'] / 1024:.0f} KiB; "
                  f"machine load {os.getloadavg()[0]:.1f}", flush=True)
            if alive == count - len(result["refused"]) and not result["refused"]:
                largest = count
            await asyncio.sleep(3.0)
            left = server.api("GET", "/api/sessions")["sessions"]  # the list, not the answer object
            if left:
                print(f"{'':>10}{len(left)} session(s) still open on the server after the clients left")
    finally:
        server.stop()
    print(f"{label}: largest N of live audio+video sessions all admitted and alive for {opts.seconds:g} s: {largest}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", default="4,8,12", help="steps: numbers of sessions, comma-separated")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--vigil-root", action="append", default=[], metavar="DIR[@REV]",
                        help="also serve another checkout, or a commit of this one (e.g. .@4de2fbe), before this one")
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
