"""Capacity of one Vigil node, the Triton detector beside the local one, and a cluster's takeover time.

1. Capacity: a ``vigil serve`` child process with the default config (default CPU models) and, as clients over
   real WebRTC on loopback, N video sessions plus ONE live voice session (Piper-spoken questions). Each video
   session is a camera that costs its client nothing: the clip (3 s bus.jpg, 3 s zidane.jpg, 640x360) is
   VP8-encoded once, and its packets are sent looped on a fixed 10 fps schedule (``target_fps`` 5), all from one
   child process, so that neither encoding nor the clients' scheduling stands in for the server's limits. N
   ramps 0, 1, 2, 4, …; at each step the voice loop's heard voice-to-voice (end of the question leaving the
   client's microphone → first audible reply sample at the client, timed in this process) and each video
   session's results rate (``detections`` messages per second at the client) are measured. Capacity = the
   largest N where the heard voice-to-voice median stays within +20 % of N=0 and every video session gets at
   least 90 % of its target rate. Explaining each step (never replacing the client-side figures): per session,
   frames the client sent, and the server's frames in / sampled / analysed / dropped per second (its ``metrics``
   messages), the detector's and the queue's median ms (``detections``); the server's event-loop lag
   (``vigil_event_loop_lag_ms``); the CPU share of the server, the video clients and this process.
2. Detector throughput: the packaged YOLO locally (Ultralytics, PyTorch) and the same weights exported by
   ``vigil export-detector`` served by a real Triton (the tritonserver binary of the nvidia-pytriton wheel, in
   .venv-triton; its Python backend runs the ONNX with onnxruntime), batches of 8, alternating A B B A.
3. Takeover: three light ``vigil serve`` nodes, redis-server and an RTSP camera; a source is SIGKILLed with its
   node, and the time until its results flow again at a client of the new node is measured, several times.
4. Cameras (``--cameras 1,4,8``, instead of 1-3): N looped real-time file sources made from real photographs
   (static noisy scenes, a person passing through at known times), per camera the analysed rate while the person is
   in view, zone-event recall against detection on every frame, static cores ÷ the decode-only floor, and the
   largest N that holds with one live voice loop: ``bench/cameras.py``.

Note: on a shared machine the figures depend on its load (printed beside them). Run it offline like the tests:
    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.capacity'
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
import cv2
from prometheus_client.parser import text_string_to_metric_families

from server.cli.client import VigilClient, connect_when_admitted
from server.media.ice import restrict_host_addresses
from tests.support.audio import Recorder, ScriptedMicrophone, silence, speech
from tests.support.browser import REPO_ROOT, VigilProcess
from tests.support.media import PrecodedVideoTrack, precoded_vp8, real_image

QUESTIONS = ["How many people do you see?", "What is the weather like today?", "Is anyone at the door?",
             "What color is the sky?", "Can you see a car outside?", "How are you today?"]
TARGET_FPS = 5.0
CAMERA_FPS = 10


# ---------------------------------------------------------------------- 1. capacity


STAGES = ("frames_in", "frames_sampled", "frames_analyzed", "frames_dropped")


class VideoSession:
    """One camera session: a looping clip sent over WebRTC; counts the detections messages that come back, and
    keeps each stage's counts from the server's ``metrics`` messages to explain a low rate."""

    def __init__(self, url: str, packets: list[bytes], fps: int) -> None:
        self.track = PrecodedVideoTrack(packets, fps)
        self.client = VigilClient(url, options={"video": {"target_fps": TARGET_FPS}})
        self.arrivals: list[float] = []
        self.timings: list[tuple[float, float, float]] = []  # (arrival, inference_ms, queue_ms)
        self.counts: list[tuple[float, dict[str, int]]] = []  # (arrival, the server's video counts)
        self.client.on_message = self._received

    def _received(self, message: dict[str, Any], at: float) -> None:
        if message.get("type") == "detections":
            self.arrivals.append(at)
            self.timings.append((at, message.get("inference_ms", 0.0), message.get("queue_ms", 0.0)))
        elif message.get("type") == "metrics" and message.get("media"):
            self.counts.append((at, message["media"]["video"]))

    def stage_rates(self, since: float, until: float) -> dict[str, float]:
        """Frames per second at each server stage (in, sampled, analysed, dropped) over the window."""
        window = [(t, c) for t, c in self.counts if since <= t < until]
        if len(window) < 2:
            return {stage: 0.0 for stage in STAGES}
        (t0, first), (t1, last) = window[0], window[-1]
        return {stage: (last[stage] - first[stage]) / (t1 - t0) for stage in STAGES}

    def report(self, since: float, until: float) -> dict[str, float]:
        timings = [(i, q) for t, i, q in self.timings if since <= t < until]
        return {"rate": sum(1 for t in self.arrivals if since <= t < until) / (until - since),
                "sent": sum(1 for t in self.track.sent if since <= t < until) / (until - since),
                **self.stage_rates(since, until),
                "inference_ms": statistics.median(i for i, _ in timings) if timings else 0.0,
                "queue_ms": statistics.median(q for _, q in timings) if timings else 0.0}

    async def open(self) -> None:
        def renew() -> None:  # refused for now (503 + Retry-After): a fresh peer and camera
            self.track.stop()
            self.track = PrecodedVideoTrack(self.track.packets, self.track.fps)
            self.client = VigilClient(self.client.base_url, options=self.client.options)
            self.client.on_message = self._received

        await connect_when_admitted(lambda: self.client.connect([self.track]), renew)

    async def close(self) -> None:
        await self.client.close()
        self.track.stop()


class VoiceSession:
    def __init__(self, url: str) -> None:
        self.mic = ScriptedMicrophone()
        self.client = VigilClient(url)
        self.recorders: list[Recorder] = []
        self.client.pc.on("track", lambda t: self.recorders.append(Recorder(t)) if t.kind == "audio" else None)
        self.turn = 0

    async def open(self) -> None:
        await self.client.connect([self.mic])
        await self.client.next_message("hello")

    async def heard_voice_to_voice(self) -> float | None:
        """One question; ms from the end of its speech leaving the microphone to the reply being audible here."""
        self.mic.say(silence(0.3))
        self.mic.say(speech(QUESTIONS[self.turn % len(QUESTIONS)]))
        self.turn += 1
        await self.mic.spoken.wait()
        ended = time.perf_counter()
        deadline = ended + 30
        while time.perf_counter() < deadline:
            heard = self.recorders[0].first_loud(since=ended) if self.recorders else None
            if heard is not None:
                await self._wait_quiet()
                return (heard - ended) * 1000.0
            await asyncio.sleep(0.01)
        return None

    async def _wait_quiet(self, quiet_s: float = 1.0, limit_s: float = 30.0) -> None:
        """Let the reply finish playing before the next question."""
        started = time.perf_counter()
        while time.perf_counter() - started < limit_s:
            last = self.recorders[0].last_loud() or 0.0
            if time.perf_counter() - last > quiet_s:
                return
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        for recorder in self.recorders:
            await recorder.stop()
        await self.client.close()


async def video_clients(url: str, size: tuple[int, int], count: int) -> None:
    """Child process: ``count`` video sessions. Reads ``measure`` then ``stop`` on stdin; prints one JSON line
    with each session's results rate and server-side frames-in rate between the two."""
    restrict_host_addresses(["127.0.0.1"])
    packets = precoded_vp8(size, CAMERA_FPS)
    sessions = [VideoSession(url, packets, CAMERA_FPS) for _ in range(count)]
    for session in sessions:
        await session.open()
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    assert (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "measure"
    started = time.perf_counter()
    assert (await loop.run_in_executor(None, sys.stdin.readline)).strip() == "stop"
    ended = time.perf_counter()
    print(json.dumps([s.report(started, ended) for s in sessions]), flush=True)
    for session in sessions:
        with contextlib.suppress(Exception):
            await session.close()


class VideoClientsProcess:
    """The video sessions of one step, in their own process: their VP8 encoding must not delay the voice
    client's clock (the heard voice-to-voice is timed in this process)."""

    def __init__(self, url: str, size: tuple[int, int], count: int) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.capacity", "--video-clients", str(count), "--url", url,
             "--size", f"{size[0]}x{size[1]}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[1])

    def wait_ready(self) -> None:
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "ready"

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def result(self) -> list[dict[str, float]]:
        assert self.proc.stdout is not None
        data = json.loads(self.proc.stdout.readline())
        self.proc.wait(timeout=60)
        return data

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


async def capacity(workdir: Path, levels: list[int], turns: int, warmup_s: float, size: tuple[int, int],
                   inference_nice: int | None = None, detector_workers: int | None = None) -> None:
    config: dict[str, Any] = {"webrtc": {"host_addresses": ["127.0.0.1"]}, "grpc": {"port": 0},
                              "sessions": {"max_sessions": max(levels) + 2}}  # everything else: the defaults
    video: dict[str, Any] = {}
    if inference_nice is not None:  # a side-by-side variant
        video["inference_nice"] = inference_nice
    if detector_workers is not None:
        video["detector_workers"] = detector_workers
    if video:
        config["video"] = video
    shown = "default config" + (f" but video {video}" if video else "")
    server = await asyncio.to_thread(VigilProcess(workdir, config).start)
    print(f"\nvigil serve ({shown}, default CPU models) at {server.url}; each video session: pre-encoded VP8 "
          f"{size[0]}x{size[1]} paced at {CAMERA_FPS} fps (no client-side encoding), target_fps {TARGET_FPS:g}, "
          "from clients in a child process")
    print(f"{'video sessions':>14} {'heard v2v median ms':>20} {'vs N=0':>7} {'min video rate':>15} "
          f"{'of target':>9}  verdict")
    print("  explaining, per video session, frames/s: client sent -> server in -> sampled -> analysed (dropped); "
          "detector ms and queue ms (medians); server event-loop lag")
    baseline: float | None = None
    held = 0
    try:
        warmup = VoiceSession(server.url)  # one turn: first-call costs stay out of the figures
        await warmup.open()
        await warmup.heard_voice_to_voice()
        await warmup.close()
        for level in levels:
            clients = VideoClientsProcess(server.url, size, level) if level else None
            # A fresh voice session per step, asked the same questions: no step pays for a longer history or
            # gets easier questions than another.
            voice = VoiceSession(server.url)
            try:
                await voice.open()
                if clients is not None:
                    await asyncio.to_thread(clients.wait_ready)
                await asyncio.sleep(warmup_s)
                lag_before = await loop_lag(server.url)
                cpu_pids = {"server": server.process.pid, "video clients": clients.proc.pid if clients else None,  # type: ignore[union-attr]
                            "voice client (this process)": os.getpid()}
                # The server with its detector workers; "this process" is alone (the server is its child).
                cost = {name: server_cpu_seconds if name == "server" else cpu_seconds for name in cpu_pids}
                cpu_before, cpu_started = {name: cost[name](pid) for name, pid in cpu_pids.items()}, time.monotonic()
                if clients is not None:
                    clients.send("measure")
                heard = [v for v in [await voice.heard_voice_to_voice() for _ in range(turns)] if v is not None]
                if clients is not None:
                    clients.send("stop")
                lag = lag_since(lag_before, await loop_lag(server.url))
                cpu_wall = time.monotonic() - cpu_started
                cpu = ", ".join(f"{name} {(cost[name](pid) - cpu_before[name]) / cpu_wall:.0%}"
                                for name, pid in cpu_pids.items() if pid is not None)
                video = await asyncio.to_thread(clients.result) if clients is not None else []
            finally:
                if clients is not None:
                    clients.kill()
                with contextlib.suppress(Exception):
                    await voice.close()
            v2v = statistics.median(heard) if heard else float("inf")
            if baseline is None:
                baseline = v2v
            rates = [session["rate"] for session in video]
            worst = min(rates) if rates else TARGET_FPS
            ok = v2v <= 1.2 * baseline and worst >= 0.9 * TARGET_FPS and len(heard) == turns
            shown = f"{worst:>13.2f}/s {worst / TARGET_FPS:>9.2f}" if rates else f"{'-':>15} {'-':>9}"
            print(f"{level:>14} {v2v:>20.0f} {v2v / baseline:>7.2f} {shown}  {'holds' if ok else 'OVER '}   "
                  f"(turns heard {len(heard)}/{turns}; load {os.getloadavg()[0]:.1f})", flush=True)
            for session in video:
                print(f"{'':>16}sent {session['sent']:.1f} -> in {session['frames_in']:.1f} -> sampled "
                      f"{session['frames_sampled']:.1f} -> analysed {session['frames_analyzed']:.1f} (dropped "
                      f"{session['frames_dropped']:.1f}); detector {session['inference_ms']:.0f} ms, queue "
                      f"{session['queue_ms']:.0f} ms", flush=True)
            print(f"{'':>16}event-loop lag: {lag}", flush=True)
            print(f"{'':>16}CPU (share of one core): {cpu}", flush=True)
            if not ok:
                break
            held = level
    finally:
        server.stop()
    print(f"capacity: {held} video session(s) at {TARGET_FPS:g} fps + 1 live voice loop on one node "
          f"(voice-to-voice within +20 % of {baseline:.0f} ms, video >= 90 % of target)")


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of a process (all its threads) so far."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # it has exited
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def server_cpu_seconds(pid: int | None) -> float:
    """CPU seconds of a server and its live child processes (its detector workers: with
    ``video.detector_workers`` the detection's CPU is theirs, and it is the server's cost all the same)."""
    import psutil

    total = cpu_seconds(pid)
    if pid is None:
        return total
    with contextlib.suppress(psutil.Error):
        total += sum(cpu_seconds(child.pid) for child in psutil.Process(pid).children(recursive=True))
    return total


async def loop_lag(url: str) -> dict[str, float]:
    """The server's ``vigil_event_loop_lag_ms`` histogram: cumulative bucket counts by upper bound, and sum."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as response:
        text = await response.text()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name == "vigil_event_loop_lag_ms":
            for sample in family.samples:
                if sample.name.endswith("_bucket"):
                    out[sample.labels["le"]] = sample.value
                elif sample.name.endswith("_sum"):
                    out["sum"] = sample.value
    return out


def lag_since(before: dict[str, float], after: dict[str, float]) -> str:
    ticks = after.get("+Inf", 0) - before.get("+Inf", 0)
    if not ticks:
        return "-"
    mean = (after["sum"] - before["sum"]) / ticks
    late = {bound: 1 - (after[bound] - before.get(bound, 0)) / ticks for bound in ("50.0", "200.0", "1000.0")}
    return (f"mean {mean:.1f} ms over {ticks:.0f} ticks; late >50 ms {late['50.0']:.1%}, >200 ms "
            f"{late['200.0']:.1%}, >1 s {late['1000.0']:.1%}")


# ---------------------------------------------------------------------- 2. detector throughput


def detector_throughput(workdir: Path, seconds: float, batch: int) -> None:
    from models.detectors.triton import TritonDetector, TritonDetectorConfig, export_model_repository
    from models.detectors.yolo import UltralyticsDetector
    from tests.support.triton_server import TritonServer

    bus = cv2.cvtColor(real_image("bus"), cv2.COLOR_RGB2BGR)
    zidane = cv2.cvtColor(real_image("zidane"), cv2.COLOR_RGB2BGR)
    images = [bus if i % 2 else zidane for i in range(batch)]
    export_model_repository(None, str(workdir / "repo"), name="pose", max_batch=batch, gpu=False)
    local = UltralyticsDetector()
    with TritonServer(workdir / "repo", "pose", log_path=workdir / "triton.log") as server:
        # A generous deadline: a batch of 8 on a shared 2-core CPU is not what timeout_s is tuned for.
        remote = TritonDetector(TritonDetectorConfig(url=server.grpc_url, model="pose", timeout_s=120))
        remote.detect(images[:1])  # warm-up (first-call costs stay out of the figures)
        remote.detect(images)
        local.detect(images)

        def leg(detector: Any) -> float:
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < seconds:
                detector.detect(images)
                done += len(images)
            return done / (time.perf_counter() - started)

        rates: dict[str, list[float]] = {"local": [], "triton": []}
        for name in ("local", "triton", "triton", "local"):
            rates[name].append(leg(local if name == "local" else remote))
        remote.close()
    local_rate, triton_rate = statistics.mean(rates["local"]), statistics.mean(rates["triton"])
    print(f"\ndetector throughput, yolo11n-pose @640, batches of {batch}, {seconds:g} s legs A B B A:")
    print(f"  local (Ultralytics/PyTorch, in process)       {local_rate:7.1f} images/s")
    print(f"  Triton (gRPC, onnxruntime in Triton, same CPU) {triton_rate:7.1f} images/s")
    print(f"  Triton / local = {triton_rate / local_rate:.2f}")


# ---------------------------------------------------------------------- 3. takeover


async def watch_lease(redis_url: str, source_id: str, dead: str, killed: float) -> dict[str, float]:
    """Seconds after the kill at which the dead node's lease on the source lapsed and another node took it
    (polled every 10 ms: explains the takeover time)."""
    import redis.asyncio as aioredis

    seen: dict[str, float] = {}
    client = aioredis.from_url(redis_url, decode_responses=True)
    try:
        while "taken" not in seen:
            holder = await client.get(f"vigil:cluster:lease:{source_id}")
            if holder != dead:
                seen.setdefault("lapsed", time.perf_counter() - killed)
            if holder is not None and holder != dead:
                seen["taken"] = time.perf_counter() - killed
            await asyncio.sleep(0.01)
    finally:
        await client.aclose()
    return seen


def export_revision(rev: str, workdir: Path) -> tuple[Path, str]:
    """This checkout's commit ``rev`` as files under ``workdir`` (to serve it beside this checkout)."""
    out = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%h %s", rev], capture_output=True,
                         text=True, check=True).stdout.strip()
    sha, _, subject = out.partition(" ")
    target = workdir / f"vigil-{sha}"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", sha], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target, f"commit {sha} ({subject[:60]})"


async def takeover(workdir: Path, rounds: int, root: Path = REPO_ROOT, label: str = "this checkout") -> None:
    from tests.support.cluster import node_config, node_name, owner_of, results_flow
    from tests.support.redis_server import RedisServer
    from tests.support.rtsp import RtspCamera

    heartbeat_s, lease_s, reconnect_max_s = 0.5, 2.0, 1.0
    times: list[float] = []
    print(f"\n{label}: takeover after SIGKILL of a source's node (lease_s {lease_s:g}, heartbeat_s {heartbeat_s:g}, "
          f"RTSP reconnect <= {reconnect_max_s:g} s); seconds after the kill: lease lapsed, taken by the new node, "
          "listed live, results flowing at a client of the new node")
    with RedisServer(workdir) as redis, RtspCamera(fps=10) as camera:
        configs = {name: node_config(redis.url, name, workdir, heartbeat_s=heartbeat_s, lease_s=lease_s,
                                     reconnect_max_s=reconnect_max_s) for name in ("a", "b", "c")}
        nodes = {name: VigilProcess(workdir, config, root=root) for name, config in configs.items()}
        try:
            await asyncio.gather(*(asyncio.to_thread(node.start) for node in nodes.values()))
            async with aiohttp.ClientSession() as http:
                for _ in range(rounds):
                    live = list(nodes.values())
                    async with http.post(f"{live[0].url}/api/sources", json={"url": camera.url}) as response:
                        source_id = (await response.json())["id"]
                    owner_name, owner = await owner_of(http, live, source_id, timeout=60)
                    await results_flow(http, owner, source_id, timeout=60)
                    await asyncio.sleep(0.1 + (len(times) % 5) * heartbeat_s / 5)  # kills spread over the renewal
                    killed = time.perf_counter()
                    owner.process.kill()  # type: ignore[union-attr]
                    lease = asyncio.create_task(watch_lease(redis.url, source_id, owner_name, killed))
                    owner.process.wait()  # type: ignore[union-attr]
                    survivors = [node for node in live if node is not owner]
                    _, new_owner = await owner_of(http, survivors, source_id, not_on=owner_name, timeout=60)
                    listed = time.perf_counter() - killed
                    await results_flow(http, new_owner, source_id, timeout=60)
                    times.append(time.perf_counter() - killed)
                    stages = await asyncio.wait_for(lease, 10)
                    print(f"  takeover {len(times)}: {times[-1]:.2f} s ({owner_name} → {node_name(new_owner)}; lapsed "
                          f"{stages.get('lapsed', float('nan')):.2f}, taken {stages.get('taken', float('nan')):.2f}, "
                          f"live {listed:.2f}, results {times[-1]:.2f})", flush=True)
                    async with http.delete(f"{survivors[0].url}/api/sources/{source_id}"):
                        pass
                    nodes[owner_name] = VigilProcess(workdir, configs[owner_name], root=root)  # back to three
                    await asyncio.to_thread(nodes[owner_name].start)
        finally:
            for node in nodes.values():
                node.stop()
    print(f"  median {statistics.median(times):.2f} s, min {min(times):.2f} s, max {max(times):.2f} s "
          f"over {len(times)} rounds (bound lease_s + reconnect: {lease_s + heartbeat_s + reconnect_max_s:.1f} s); "
          f"load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


# ---------------------------------------------------------------------- main


async def main(opts: argparse.Namespace) -> None:
    if opts.video_clients is not None:
        width, height = (int(v) for v in opts.size.split("x"))
        await video_clients(opts.url, (width, height), opts.video_clients)
        return
    restrict_host_addresses(["127.0.0.1"])
    # The machine may be shared: say how busy it was, beside the figures.
    print(f"load average at start: {' '.join(f'{v:.1f}' for v in os.getloadavg())} ({os.cpu_count()} CPUs)")
    with tempfile.TemporaryDirectory(prefix="vigil-capacity-") as tmp:
        workdir = Path(tmp)
        if opts.cameras:
            from bench.cameras import cameras, detector_rate

            detector = {"device": opts.detector_device, "half": opts.half} if opts.detector_device else None
            if detector:
                await asyncio.to_thread(detector_rate, opts.detector_device, opts.half, min(opts.seconds, 10.0))
            await cameras(workdir, opts.cameras, opts.seconds, opts.warmup, opts.turns, detector,
                          ungated=not opts.no_ungated, detector_workers=opts.detector_workers,
                          inference_nice=opts.inference_nice)
            print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
            return
        if "capacity" in opts.parts:
            width, height = (int(v) for v in opts.size.split("x"))
            for workers in opts.detector_workers or [None]:
                for nice in opts.inference_nice or [None]:
                    await capacity(workdir, opts.levels, opts.turns, opts.warmup, (width, height), nice, workers)
        if "detector" in opts.parts:
            await asyncio.to_thread(detector_throughput, workdir, opts.seconds, opts.batch)
        if "takeover" in opts.parts:
            if opts.takeover_baseline:  # the same rounds against another revision first, in the same run
                root, label = export_revision(opts.takeover_baseline, workdir)
                await takeover(workdir, opts.rounds, root, label)
            await takeover(workdir, opts.rounds)
    print(f"load average at end: {' '.join(f'{v:.1f}' for v in os.getloadavg())}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", default=["capacity", "detector", "takeover"],
                        choices=["capacity", "detector", "takeover"])
    parser.add_argument("--levels", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16],
                        help="video sessions at each step (0 first: the voice loop's baseline)")
    parser.add_argument("--size", default="640x360", help="video sessions' frame size, WIDTHxHEIGHT")
    parser.add_argument("--inference-nice", type=int, nargs="+",
                        help="capacity and cameras: run once per value of video.inference_nice, side by side "
                             "(default: the default config only)")
    parser.add_argument("--detector-workers", type=int, nargs="+", metavar="N",
                        help="capacity and cameras: serve with video.detector_workers N (0: detection in process; "
                             "default: the server's default); several: once per value, side by side")
    parser.add_argument("--turns", type=int, default=5, help="voice turns measured per step")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds after adding sessions before measuring")
    parser.add_argument("--seconds", type=float, default=8.0,
                        help="detector throughput: seconds per leg; cameras: seconds measured per phase")
    parser.add_argument("--cameras", type=lambda text: [int(v) for v in text.split(",")], metavar="N[,N...]",
                        help="cameras mode (bench/cameras.py) with these numbers of file sources, instead of --parts")
    parser.add_argument("--detector-device", help="cameras: models.detector.device (e.g. cuda:0), and print the "
                        "detector's images/s on it first")
    parser.add_argument("--half", action="store_true", help="cameras: models.detector.half (FP16 on CUDA)")
    parser.add_argument("--no-ungated", action="store_true",
                        help="cameras: skip the side-by-side run with video.motion.enabled false")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5, help="takeover: kills measured")
    parser.add_argument("--takeover-baseline", metavar="REV",
                        help="takeover: also measure this git revision of the checkout (before this one)")
    parser.add_argument("--video-clients", type=int, help=argparse.SUPPRESS)  # the child process of step 1
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    asyncio.run(main(parse_args()))
