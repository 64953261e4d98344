"""Voice-loop benchmark: voice-to-voice latency with its stage breakdown, streaming prefill on vs off, and the
barge-in stop time, with the embedded models (Silero VAD, Whisper tiny.en, SmolLM2, Piper) over real WebRTC.

A real aiortc client speaks Piper-synthesised questions into a Vigil session on loopback and reads each turn's
``metrics`` message. Prefill on and off run in one process, alternating (on, off, off, on) so drift hits both.
Run it offline like the tests:  make bench BENCH=voice  or
    unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.voice --turns 10'
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from aiohttp import web

from server.app import create_app
from server.client import VigilClient
from server.config import load_settings
from server.ice import restrict_host_addresses
from tests.support.audio import Recorder, ScriptedMicrophone, silence, speech

QUESTIONS = [
    "How many people do you see?",
    "What is the weather like today?",
    "Can you see a car outside?",
    "What color is the sky?",
    "Is anyone at the door?",
    "How are you today?",
    "What time is it now?",
    "Tell me something about cats.",
    "Where is the nearest train station?",
    "What do you see on the table?",
]
STAGES = ["end_of_speech_to_final_ms", "llm_first_token_ms", "first_audio_ms", "voice_to_voice_ms"]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Server:
    def __init__(self, prefill: bool) -> None:
        self.settings = load_settings(None, {
            "webrtc": {"host_addresses": ["127.0.0.1"]},
            "models": {"detector": {"backend": "none"}},
            "voice": {"prefill": prefill, "end_of_turn_silence_ms": 500, "max_reply_tokens": 48},
        })

    async def __aenter__(self) -> str:
        self.runner = web.AppRunner(create_app(self.settings))
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def __aexit__(self, *exc: object) -> None:
        await self.runner.cleanup()


async def call(url: str, turns: int, barge_in: bool) -> list[dict[str, Any]]:
    """Speak ``turns`` questions; with ``barge_in``, interrupt each reply as soon as it is audible."""
    mic = ScriptedMicrophone()
    client = VigilClient(url)
    recorder: list[Recorder] = []
    client.pc.on("track", lambda track: recorder.append(Recorder(track)) if track.kind == "audio" else None)
    await client.connect([mic])
    await client.next_message("hello")
    results = []
    try:
        for index in range(turns):
            mic.say(silence(0.3))
            mic.say(speech(QUESTIONS[index % len(QUESTIONS)]))
            number = index * (2 if barge_in else 1) + 1
            if barge_in:
                await client.next_message("transcript", 60, where=lambda m, n=number: m["final"] and m["turn"] == n)
                started = time.perf_counter()
                while recorder[0].first_loud(since=started) is None:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                mic.say(speech("Stop."))
            metrics = await client.next_message(
                "metrics", 120, where=lambda m, n=number: "turn" in m and m["turn"]["turn"] == n)
            results.append(metrics["turn"])
            if barge_in:  # let the interruption's own turn finish before the next question
                await client.next_message("metrics", 120,
                                          where=lambda m, n=number: "turn" in m and m["turn"]["turn"] == n + 1)
            await asyncio.sleep(2.5 if not barge_in else 1.0)  # the reply finishes playing
    finally:
        for r in recorder:
            await r.stop()
        await client.close()
    return results


def report(name: str, turns: list[dict[str, Any]]) -> dict[str, float]:
    print(f"\n{name}: {len(turns)} turns")
    print(f"  {'stage':30} {'median':>8} {'p95':>8}   (ms)")
    summary = {}
    for stage in STAGES:
        values = [t[stage] for t in turns if t.get(stage) is not None]
        if values:
            summary[stage] = statistics.median(values)
            print(f"  {stage:30} {statistics.median(values):8.0f} {percentile(values, 0.95):8.0f}   n={len(values)}")
    reused = sum(1 for t in turns if t.get("prefill") == "reused")
    restarted = sum(1 for t in turns if t.get("prefill") == "restarted")
    saved = [t["prefill_saved_ms"] for t in turns if t.get("prefill_saved_ms") is not None]
    print(f"  prefill: reused {reused}, restarted {restarted}, none {len(turns) - reused - restarted}"
          + (f", saved median {statistics.median(saved):.0f} ms" if saved else ""))
    return summary


async def main(turns: int, barge_ins: int) -> None:
    restrict_host_addresses(["127.0.0.1"])
    started = time.perf_counter()
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    half = max(1, turns // 2)
    for prefill in (True, False, False, True):  # alternate, so machine drift hits both
        async with Server(prefill) as url:
            runs[prefill] += await call(url, half, barge_in=False)
    on = report("prefill on", runs[True])
    off = report("prefill off", runs[False])
    async with Server(True) as url:
        barged = await call(url, barge_ins, barge_in=True)
    stops = [t["barge_in_stop_ms"] for t in barged if t.get("barge_in_stop_ms") is not None]
    print(f"\nbarge-in: {len(stops)}/{barge_ins} interrupted replies")
    if stops:
        print(f"  stop time median {statistics.median(stops):.0f} ms, p95 {percentile(stops, 0.95):.0f} ms "
              f"(goal p95 < 150 ms: {'met' if percentile(stops, 0.95) < 150 else 'NOT met'})")
    v2v_on, v2v_off = on.get("voice_to_voice_ms"), off.get("voice_to_voice_ms")
    if v2v_on and v2v_off:
        print(f"\nvoice-to-voice median: prefill on {v2v_on:.0f} ms / off {v2v_off:.0f} ms = {v2v_on / v2v_off:.2f}")
        best = min(v2v_on, v2v_off)
        print(f"goal median < 1200 ms: {'met' if best < 1200 else 'NOT met'} (best {best:.0f} ms)")
    print(f"total wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=12, help="turns per prefill setting (split in two legs)")
    parser.add_argument("--barge-ins", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.barge_ins))
