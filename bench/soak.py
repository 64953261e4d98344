"""Soak: does a server stay the same size after many sessions? (memory grew with every session)

A ``vigil serve`` child process with the default config (default CPU models, voice, memory and storage on; its data
dirs in a temporary folder; only the offer rate limit raised, and ICE on loopback) and, in this process, one aiortc
client with audio (a live microphone: silence, paced in real time) and video (pre-encoded VP8 at 10 fps, as
``bench/capacity.py`` sends it) that connects, streams for ``--hold-s``, DELETEs its session, hangs up and waits
``--gap-s``, ``--cycles`` times. Every ``--every`` cycles it prints the server's RSS (anonymous and file-backed), OS
threads (and their names, counted, with what changed) and open fds (from /proc); at the end the growth since the
warm-up (``--warmup`` cycles), the sessions the server still lists (``GET /api/sessions``) and the cycles that failed.
Goal: RSS growth < 20 MB after warm-up, threads flat, 0 sessions left, 0 failures. The warm-up (100 cycles) runs
every code path once, the memory store's first compaction included (file-backed code paged in, not growth).

    make bench BENCH=soak ARGS="--cycles 200"
    python -m bench.soak --vigil-root /tmp/vigil-before   # serve another checkout (e.g. before a fix)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from bench.capacity import CAMERA_FPS, PrecodedVideoTrack, precoded_vp8
from server.cli.client import VigilClient
from server.media.ice import restrict_host_addresses
from tests.support.audio import ScriptedMicrophone
from tests.support.browser import REPO_ROOT, VigilProcess

VIDEO_SIZE = (640, 360)


def process_figures(pid: int) -> dict[str, float]:
    """RSS (MB; its anonymous and file-backed parts: a library's code paged in is file-backed, shared and
    reclaimable), OS threads and open fds of a process, read from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_mb": int(fields["VmRSS"].split()[0]) / 1024, "anon_mb": int(fields["RssAnon"].split()[0]) / 1024,
            "file_mb": int(fields["RssFile"].split()[0]) / 1024, "threads": int(fields["Threads"]),
            "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def merge_config(base: dict[str, Any], overrides: dict[str, Any]) -> None:
    """Merge ``overrides`` into ``base`` section by section (``{"memory": {"enabled": false}}`` keeps the rest)."""
    for key, value in overrides.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            merge_config(base[key], value)
        else:
            base[key] = value


def thread_groups(pid: int) -> Counter[str]:
    """The process's OS threads counted by name (/proc/PID/task/*/comm: Python threads show the process's name)."""
    groups: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended while we looked
            groups[(task / "comm").read_text().strip()] += 1
    return groups


async def one_cycle(url: str, packets: list[bytes], hold_s: float) -> None:
    client = VigilClient(url)
    video, microphone = PrecodedVideoTrack(packets, CAMERA_FPS), ScriptedMicrophone()
    try:
        await client.connect([microphone, video])
        await asyncio.sleep(hold_s)
    finally:
        await client.close(grace=2.0)
        video.stop()
        microphone.stop()


async def listed_sessions(url: str) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/api/sessions") as response:
        response.raise_for_status()
        return (await response.json())["sessions"]


async def soak(args: argparse.Namespace, workdir: Path) -> None:
    config: dict[str, Any] = {
        "webrtc": {"host_addresses": ["127.0.0.1"],
                   "offer_rate_limit": {"requests": 1_000_000, "window_s": 60.0}},  # one client, many offers
        "grpc": {"port": 0},
        "memory": {"enabled": True, "data_dir": str(workdir / "memory")},  # the default, but not in the checkout
        "storage": {"data_dir": str(workdir / "timeline")},
    }
    merge_config(config, json.loads(args.config_json))
    restrict_host_addresses(["127.0.0.1"])  # aioice offers no loopback candidate otherwise
    packets = precoded_vp8(VIDEO_SIZE, CAMERA_FPS)
    # a debug hook (a sitecustomize.py, e.g. tracemalloc) goes first on the served process's path, never in the server
    env = {"PYTHONPATH": os.pathsep.join([*map(str, args.server_path), str(args.vigil_root)])}
    server = await asyncio.to_thread(VigilProcess(workdir, config, root=args.vigil_root, env=env).start)
    assert server.process is not None
    pid = server.process.pid
    overrides = f", overrides {args.config_json}" if args.config_json != "{}" else ""
    print(f"vigil serve from {args.vigil_root} (default config{overrides}, offer rate limit raised) at {server.url}; "
          f"client: "
          f"audio (live microphone, silence) + video (VP8 {VIDEO_SIZE[0]}x{VIDEO_SIZE[1]} at {CAMERA_FPS} fps); "
          f"{args.cycles} cycles of {args.hold_s:g} s connected + {args.gap_s:g} s apart", flush=True)
    print(f"{'cycle':>6} {'RSS MB':>8} {'anon MB':>8} {'file MB':>8} {'threads':>8} {'fds':>5} {'failures':>9} "
          f"{'elapsed s':>10}", flush=True)
    failures: list[str] = []
    started = time.monotonic()
    start_figures = process_figures(pid)
    warm: dict[str, float] | None = None
    shown: dict[int, dict[str, float]] = {}
    peak_threads = 0.0

    last_groups: Counter[str] = Counter()

    def show(cycle: int) -> dict[str, float]:
        nonlocal last_groups
        figures, groups = process_figures(pid), thread_groups(pid)
        print(f"{cycle:>6} {figures['rss_mb']:>8.1f} {figures['anon_mb']:>8.1f} {figures['file_mb']:>8.1f} "
              f"{figures['threads']:>8.0f} {figures['fds']:>5.0f} "
              f"{len(failures):>9} {time.monotonic() - started:>10.0f}", flush=True)
        # which threads came or went since the last report: a step in the count names its owner
        changes = [f"{name} {groups[name] - last_groups[name]:+d}" for name in sorted(groups | last_groups)
                   if last_groups and groups[name] != last_groups[name]]
        listed = ", ".join(f"{name} x{count}" for name, count in groups.most_common())
        print(f"{'':>6} threads by name: {listed}" + (f" (changed: {', '.join(changes)})" if changes else ""),
              flush=True)
        last_groups = groups
        shown[cycle] = figures
        return figures

    try:
        show(0)
        for cycle in range(1, args.cycles + 1):
            try:
                await asyncio.wait_for(one_cycle(server.url, packets, args.hold_s), args.hold_s + 60)
            except Exception as error:  # every failure is counted and shown; the soak goes on
                failures.append(f"cycle {cycle}: {error!r}"[:300])
                print(f"  failure: {failures[-1]}", flush=True)
            await asyncio.sleep(args.gap_s)
            if cycle % 20 == 0:
                gc.collect()  # the client's own aiortc objects, not the server's
            if cycle > args.warmup:
                peak_threads = max(peak_threads, process_figures(pid)["threads"])
            if cycle == args.warmup:
                warm = show(cycle)
            elif cycle % args.every == 0 or cycle == args.cycles:
                show(cycle)
        # closes in flight finish, and LanceDB's tokio blocking threads (its compactions' I/O) exit after 10 s idle:
        # the end figures are the server at rest, as the warm-up's are between two cycles
        await asyncio.sleep(12.0)
        left = await listed_sessions(server.url)
        end = process_figures(pid)
    finally:
        server.stop()
    base = warm or start_figures
    since = f"after the {args.warmup}-cycle warm-up" if warm else "since start (no warm-up reached)"
    print(f"\nRSS {start_figures['rss_mb']:.1f} MB at start, {base['rss_mb']:.1f} after warm-up, "
          f"{end['rss_mb']:.1f} at the end: growth {since} {end['rss_mb'] - base['rss_mb']:+.1f} MB "
          f"(anonymous {end['anon_mb'] - base['anon_mb']:+.1f}, file-backed {end['file_mb'] - base['file_mb']:+.1f})")
    print(f"OS threads {start_figures['threads']:.0f} at start, {base['threads']:.0f} after warm-up, "
          f"{end['threads']:.0f} at the end (peak after warm-up {peak_threads:.0f}): growth "
          f"{end['threads'] - base['threads']:+.0f}")
    # the slope of the second half: a leak keeps climbing there, a one-off warm-up step does not
    half = max((cycle for cycle in shown if cycle <= args.cycles // 2), default=None)
    if half is not None and half >= args.warmup and args.cycles > half:
        per_100 = 100 / (args.cycles - half)
        grown = {key: end[key] - shown[half][key] for key in ("rss_mb", "anon_mb", "file_mb")}
        print(f"second half (cycles {half}..{args.cycles}): RSS {grown['rss_mb']:+.1f} MB "
              f"(anonymous {grown['anon_mb']:+.1f}, file-backed {grown['file_mb']:+.1f}), "
              f"{grown['rss_mb'] * per_100:+.2f} MB per 100 cycles; threads "
              f"{end['threads'] - shown[half]['threads']:+.0f}")
    print(f"open fds {start_figures['fds']:.0f} at start, {base['fds']:.0f} after warm-up, {end['fds']:.0f} at the end")
    print(f"sessions left open: {len(left)}; failures: {len(failures)} of {args.cycles} cycles")
    for failure in failures[:20]:
        print(f"  {failure}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=1000, help="connect/disconnect cycles (default 1000)")
    # 100: past the memory store's first compaction (every 64 writes; a soak session writes about one), when
    # LanceDB pages in its compaction code once per process (~12.5 MB file-backed, shared and reclaimable)
    parser.add_argument("--warmup", type=int, default=100, help="growth is measured from this cycle on")
    parser.add_argument("--every", type=int, default=20, help="print the server's figures every N cycles")
    parser.add_argument("--hold-s", type=float, default=0.5, help="seconds each session stays connected")
    parser.add_argument("--gap-s", type=float, default=0.5, help="seconds between sessions")
    parser.add_argument("--vigil-root", type=Path, default=REPO_ROOT, help="the checkout to serve")
    parser.add_argument("--config-json", default="{}",
                        help='config overrides for the served process, e.g. \'{"memory": {"enabled": false}}\'')
    parser.add_argument("--server-path", type=Path, action="append", default=[],
                        help="a folder put first on the served process's PYTHONPATH (a debug sitecustomize.py)")
    args = parser.parse_args()
    os.environ.setdefault("VIGIL_GRPC__PORT", "0")
    with tempfile.TemporaryDirectory(prefix="vigil-soak-") as workdir:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(soak(args, Path(workdir)))


if __name__ == "__main__":
    main()
