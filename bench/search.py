"""Memory search benchmark: ingestion entries/s, search latency p50/p95 at 10k and 100k entries, and recall@5 of
hybrid vs keyword-only vs vector-only search on generated paraphrased questions.

The corpus is a generated timeline: 200 "needle" facts among filler entries of every kind (zone events, scene
summaries, transcripts, replies) that reuse the same names, objects, places and kinds of vehicles. Each needle has
one question that paraphrases it. Two families, half each: people ("Okafor left the parcel next to the bakery." /
"Where did Okafor put the package?": the name is the only shared keyword, so keyword search finds everything
Okafor did, while vector search gets the paraphrase) and vehicles ("Delivery van KX17 ABC waited at dock 4 for 20
minutes." / "How long did the KX17 ABC van stay at the loading area?": the plate is the shared keyword, which a
sentence embedding blurs among many similar vans). recall@5 counts questions whose needle is in the top 5.

Every entry's text is distinct: the fillers are generated combinatorially (``filler_texts``: eleven templates
whose slots span far more combinations than needed, drawn without repeats), so no search is helped or hurt by
identical vectors. MiniLM on a shared 2-core CPU embeds 50-300 texts per second, so the texts are embedded once
and cached in ``.cache/bench-search/`` (git-ignored; the first run spends minutes on 100k texts). The index is
built in this process through ``MemoryIndex`` with those cached vectors (``PrecomputedEmbedderForBench``, the
bench's seam); ingestion with real embedding is measured on fresh texts separately. Searches are measured where
a user meets them: ``GET /api/search`` over HTTP against ``vigil serve`` in its own process with the default
memory config (MiniLM embeds each query there), sequential requests; the server's own step timings
(``timings_ms``) explain where the time goes.

    nice unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.search'

Under load (``--load-sessions N``): ``vigil serve`` with the default config (default CPU models, memory on a
small real-MiniLM corpus), searched at ``--load-rate`` requests/s (open loop: a request is sent on schedule
whether or not the previous ones answered) for ``--load-seconds``, first alone, then with N WebRTC sessions
sending audio (a live microphone, low noise) and video (pre-encoded VP8 at 10 fps, as ``bench/capacity.py``)
from a child process. It prints p50/p95 of the answered searches, how many were shed (503 ``server_busy``) or
failed otherwise, and how many sessions were still connected at the end. ``--vigil-root DIR`` serves another
checkout (e.g. an older revision exported with ``git archive``) for a before/after figure:

    nice unshare -n bash -c 'ip link set lo up && .venv/bin/python -m bench.search --load-sessions 8'
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from pipelines.memory.entries import MemoryEntry
from pipelines.memory.index import MemoryIndex
from pipelines.memory.lance_vectors import LanceVectors
from tests.support.vigil_process import VigilProcess

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "bench-search"

NAMES = ("Okafor Lindqvist Moreau Tanaka Silva Novak Haddad Kowalski Brennan Petrov Nakamura Fischer Rossi Duarte "
         "Ivanova Mensah Larsen Quinn Sato Yilmaz Abara Costa Dubois Eriksen Farouk Galli Horvath Ibsen Jansen Kaur "
         "Laine Molina Nilsen Oyelaran Park Reyes Sandoval Toivonen Urquhart Varga").split()
OBJECTS = [("parcel", "package"), ("bicycle", "bike"), ("ladder", "step ladder"), ("toolbox", "tool kit"),
           ("suitcase", "luggage"), ("keys", "key ring"), ("laptop", "notebook computer"), ("pram", "stroller"),
           ("wallet", "purse"), ("shopping bags", "groceries"), ("dog lead", "leash"), ("drill", "power tool"),
           ("crate", "wooden box"), ("umbrella", "parasol"), ("helmet", "crash hat"), ("letters", "post")]
PLACES = [("shed", "garden hut"), ("bakery", "bread shop"), ("garage", "car port"), ("front door", "entrance"),
          ("mailbox", "letterbox"), ("side gate", "side entrance"), ("back porch", "rear veranda"),
          ("recycling bins", "rubbish bins"), ("lift", "elevator"), ("stairwell", "staircase"),
          ("car park", "parking lot"), ("reception desk", "front desk"), ("loading bay", "delivery dock"),
          ("bike rack", "cycle stand"), ("fountain", "water feature"), ("kitchen window", "window by the sink")]
QUESTIONS = ["Where did {name} put the {object}?", "What did {name} drop off by the {place}?",
             "Did {name} leave a {object} somewhere?", "Which thing of {name}'s is near the {place}?"]
LABELS = ["person", "car", "dog", "bicycle", "truck", "cat"]


def plate(rng: random.Random) -> str:
    letters = "ABCDEFGHJKLMNPRSTVWXYZ"
    return (f"{rng.choice(letters)}{rng.choice(letters)}{rng.randint(10, 99)} "
            f"{''.join(rng.choice(letters) for _ in range(3))}")


def needles(count: int = 200) -> list[tuple[str, str]]:
    """(fact, paraphrased question) pairs in two families, half each. People: every name has several facts,
    every object and place many; the question shares only the name. Vehicles: number plates (what a camera
    timeline is full of) that a sentence embedding blurs; the question shares the plate and paraphrases the rest."""
    rng = random.Random(7)
    combos = set()
    pairs = []
    while len(pairs) < count // 2:
        van = plate(rng)
        dock, minutes = rng.randint(1, 9), rng.randint(5, 55)
        question = rng.choice(["How long did the {p} van stay at the loading area?",
                               "When was the vehicle {p} unloading?", "Which bay did {p} use?"]).format(p=van)
        pairs.append((f"Delivery van {van} waited at dock {dock} for {minutes} minutes.", question))
    while len(pairs) < count:
        name, (obj, obj_syn), (place, place_syn) = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(PLACES)
        if (name, obj) in combos or (name, place) in combos:
            continue
        combos |= {(name, obj), (name, place)}
        question = rng.choice(QUESTIONS).format(name=name, object=obj_syn, place=place_syn)
        pairs.append((f"{name} left the {obj} next to the {place}.", question))
    return pairs


WHEN = ["this morning", "at noon", "this afternoon", "this evening", "last night", "at dawn", "before lunch",
        "after lunch", "around nine", "around eleven", "around two", "around five", "yesterday", "on Monday",
        "on Tuesday", "on Wednesday", "on Thursday", "on Friday", "on Saturday", "on Sunday", "just now",
        "an hour ago", "twice today", "earlier"]
COLOURS = ["red", "blue", "white", "black", "grey", "green", "silver", "yellow"]


def filler_texts(count: int) -> list[tuple[str, str]]:
    """``count`` distinct (kind, text) filler entries, generated combinatorially: eleven templates, an equal share
    each, whose slots (names, objects, places, labels, track ids, times, colours, plates...) span far more
    combinations than the share, drawn without repeats. They mention the same names, objects and places as the
    needles, so both searches have near misses to rank below them."""
    rng = random.Random(11)
    templates = [
        ("event", lambda: f"{rng.choice(LABELS)} (track {rng.randint(1, 2000)}) entered zone "
                          f"'{rng.choice(PLACES)[0]}'"),
        ("event", lambda: f"{rng.choice(LABELS)} (track {rng.randint(1, 2000)}) left zone '{rng.choice(PLACES)[0]}' "
                          f"after {rng.randint(1, 90)}.0 s"),
        ("event", lambda: f"{rng.choice(LABELS)} (track {rng.randint(1, 2000)}) crossed line "
                          f"'{rng.choice(PLACES)[0]}' going {rng.choice(['in', 'out'])}"),
        ("scene", lambda: f"The camera currently sees {rng.randint(1, 4)} {rng.choice(LABELS)}s and 1 "
                          f"{rng.choice(OBJECTS)[0]}. Zone '{rng.choice(PLACES)[0]}' has {rng.randint(0, 3)} "
                          f"object(s) in it."),
        ("transcript", lambda: f"{rng.choice(NAMES)} walked past the {rng.choice(PLACES)[0]} {rng.choice(WHEN)}."),
        ("transcript", lambda: f"Has anyone seen the {rng.choice(OBJECTS)[0]}? {rng.choice(NAMES)} was asking "
                               f"{rng.choice(WHEN)}."),
        ("transcript", lambda: f"{rng.choice(NAMES)} called about the {rng.choice(PLACES)[0]} at "
                               f"{rng.randint(1, 12)} o'clock {rng.choice(WHEN[12:20])}."),
        ("reply", lambda: f"I can see {rng.randint(1, 4)} {rng.choice(COLOURS)} {rng.choice(LABELS)}s near the "
                          f"{rng.choice(PLACES)[0]} {rng.choice(WHEN)}."),
        ("event", lambda: f"truck (track {rng.randint(1, 2000)}) entered zone 'dock {rng.randint(1, 9)}'"),
        ("transcript", lambda: f"Van {plate(rng)} is booked for dock {rng.randint(1, 9)} {rng.choice(WHEN[12:20])}."),
        ("transcript", lambda: f"Delivery van {plate(rng)} left the loading area after {rng.randint(5, 55)} minutes."),
    ]
    made: dict[str, str] = {}
    for number, (kind, draw) in enumerate(templates):
        share = (count * (number + 1)) // len(templates) - (count * number) // len(templates)
        quota = len(made) + share
        while len(made) < quota:  # every template spans >= 15,000 texts: a share of 100k is ~9,100
            made.setdefault(draw(), kind)
    texts = list(made.items())
    rng.shuffle(texts)
    return [(kind, text) for text, kind in texts]


def embed_cached(texts: list[str]) -> np.ndarray:
    """MiniLM vectors of ``texts``, computed once and kept in .cache/bench-search/."""
    key = hashlib.sha256("\n".join(texts).encode()).hexdigest()[:16]
    path = CACHE / f"minilm-{key}.npy"
    if path.exists():
        return np.load(path)
    print(f"  embedding {len(texts):,} distinct texts with MiniLM (once; cached in {CACHE})", flush=True)
    from models.embeddings import MiniLmEmbedder

    embedder = MiniLmEmbedder()
    started = time.perf_counter()
    parts = []
    for start in range(0, len(texts), 256):
        parts.append(embedder.embed(texts[start:start + 256]))
        if len(parts) % 40 == 0 or start + 256 >= len(texts):
            print(f"  embedded {start + len(parts[-1])}/{len(texts)} distinct texts "
              f"({(start + len(parts[-1])) / (time.perf_counter() - started):.0f}/s)", flush=True)
    vectors = np.concatenate(parts)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


class PrecomputedEmbedderForBench:
    """Named seam: looks up the cached MiniLM vector of a corpus text (the index's writes need no model)."""

    name = "all-MiniLM-L6-v2 (cached)"
    dimension = 384

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        self._rows = {text: index for index, text in enumerate(texts)}
        self._vectors = vectors

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._vectors[[self._rows[t] for t in texts]]


def corpus(size: int, pairs: list[tuple[str, str]], fillers: list[tuple[str, str]]) -> list[MemoryEntry]:
    """The needles and the first ``size - len(pairs)`` fillers: every entry's text is distinct."""
    rng = random.Random(size)
    now = time.time()
    entries = [MemoryEntry("transcript", fact, "cam-needles", "cam-needles", 1.0, now - rng.uniform(0, 86_400))
               for fact, _ in pairs]
    assert len(fillers) >= size - len(entries), "fewer distinct fillers than the corpus needs"
    for kind, text in fillers[:size - len(entries)]:
        source = f"cam{rng.randint(1, 20)}"
        entries.append(MemoryEntry(kind, text, source, source, rng.uniform(0, 3600), now - rng.uniform(0, 86_400)))
    rng.shuffle(entries)
    return entries


async def build_index(data_dir: Path, entries: list[MemoryEntry], embedder: PrecomputedEmbedderForBench) -> float:
    """Index ``entries`` through MemoryIndex.add (batched, as live ingestion does); returns entries/s."""
    index = MemoryIndex(data_dir, lambda: embedder,
                        lambda dim: LanceVectors(data_dir / "vectors.lance", "vigil_memory", dim),
                        queue_max=len(entries) + 1, batch_max=256)
    index.start()
    started = time.perf_counter()
    index.add(entries)
    await index.flush()
    rate = len(entries) / (time.perf_counter() - started)
    await index.close()
    return rate


async def ingestion_with_embedding(data_dir: Path, count: int) -> float:
    """Fresh texts through the real path: MiniLM embeds each batch, then SQLite and LanceDB."""
    from models.embeddings import MiniLmEmbedder

    embedder = MiniLmEmbedder()
    embedder.embed(["warm-up"])
    index = MemoryIndex(data_dir, lambda: embedder,
                        lambda dim: LanceVectors(data_dir / "vectors.lance", "vigil_memory", dim),
                        queue_max=count + 1, batch_max=64)
    index.start()
    rng = random.Random(3)
    entries = [MemoryEntry("event", f"{rng.choice(LABELS)} (track {i}) entered zone '{rng.choice(PLACES)[0]}' "
                                    f"at gate {rng.randint(1, 99)}", "cam1", "cam1", float(i), time.time())
               for i in range(count)]
    started = time.perf_counter()
    index.add(entries)
    await index.flush()
    rate = count / (time.perf_counter() - started)
    await index.close()
    return rate


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def measure(url: str, pairs: list[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    """Each mode: client-side latency of every question, recall@5, and the server's median step timings."""
    results: dict[str, dict[str, Any]] = {}
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{url}/api/search", params={"q": "warm up the query embedder"}) as response:
            assert response.status == 200, await response.text()
        for mode in ("keyword", "vector", "hybrid"):
            latencies, hits, steps = [], {"people": 0, "vehicles": 0}, []
            for fact, question in pairs:
                started = time.perf_counter()
                async with http.get(f"{url}/api/search", params={"q": question, "limit": "5", "mode": mode}) as r:
                    body = await r.json()
                latencies.append((time.perf_counter() - started) * 1000.0)
                family = "vehicles" if fact.startswith("Delivery van") else "people"
                hits[family] += any(result["text"] == fact for result in body["results"])
                steps.append(body["timings_ms"])
            step_names = sorted({name for s in steps for name in s})
            half = len(pairs) / 2
            results[mode] = {"p50": percentile(latencies, 0.5), "p95": percentile(latencies, 0.95),
                             "recall": sum(hits.values()) / len(pairs),
                             "people": hits["people"] / half, "vehicles": hits["vehicles"] / half,
                             "steps": {n: statistics.median(s.get(n, 0.0) for s in steps) for n in step_names}}
    return results


def voice_detector_cost(rounds: int = 2000) -> None:
    """What memory costs an ordinary voice turn: the rule-based past-question detector (no retrieval runs)."""
    from pipelines.memory.recall import asks_about_past, rewrite_query

    ordinary = ["How many people do you see?", "Turn the lights on in the kitchen please.",
                "What colour is the car outside?", "Tell me a short joke about cats."]
    past = ["What did I tell you about the bicycle earlier?", "When did someone last come to the door?"]
    assert not any(asks_about_past(t) for t in ordinary) and all(asks_about_past(t) for t in past)
    started = time.perf_counter()
    for index in range(rounds):
        asks_about_past(ordinary[index % len(ordinary)])
    detect_us = (time.perf_counter() - started) / rounds * 1e6
    started = time.perf_counter()
    for index in range(rounds):
        rewrite_query(past[index % len(past)], [])
    rewrite_us = (time.perf_counter() - started) / rounds * 1e6
    print(f"voice loop: past-question detector {detect_us:.1f} us per ordinary turn (nothing else runs); "
          f"rewrite {rewrite_us:.1f} us per past question, then one hybrid search (below)")


async def main(args: argparse.Namespace) -> None:
    print(f"bench.search on {os.cpu_count()} CPU(s), load average {os.getloadavg()[0]:.1f}; MiniLM-L6 embeddings, "
          f"SQLite FTS5 + LanceDB (IVF_FLAT) in one data dir, `vigil serve` in its own process")
    voice_detector_cost()
    pairs = needles(args.questions)
    fillers = filler_texts(max(args.sizes) - len(pairs))
    texts = [fact for fact, _ in pairs] + [text for _, text in fillers]
    vectors = embed_cached(texts)
    embedder = PrecomputedEmbedderForBench(texts, vectors)
    root = Path(tempfile.mkdtemp(prefix="vigil-bench-search-"))
    try:
        rate = await ingestion_with_embedding(root / "ingest", args.ingest)
        print(f"\ningestion, MiniLM embedding included ({args.ingest} new entries, batches of 64): "
              f"{rate:,.0f} entries/s")
        rows = []
        for size in args.sizes:
            data_dir = root / f"n{size}"
            write_rate = await build_index(data_dir, corpus(size, pairs, fillers), embedder)
            print(f"ingestion, vectors precomputed ({size:,} entries: SQLite + FTS5 + LanceDB): "
                  f"{write_rate:,.0f} entries/s", flush=True)
            # vigil serve with memory on data_dir, nothing else loaded
            server = VigilProcess(root, {"voice": {"enabled": False}, "models": {"detector": {"backend": "none"}},
                                         "grpc": {"port": 0}, "memory": {"data_dir": str(data_dir)}})
            try:
                await asyncio.to_thread(server.start)
                rows.append((size, await measure(server.url, pairs)))
            finally:
                await asyncio.to_thread(server.stop, 60)
        print(f"\nGET /api/search, {len(pairs)} paraphrased questions, sequential, limit 5 (client-side ms; goal: "
              f"p95 < 50 ms at 100k; recall@5: hybrid above both)")
        print(f"{'entries':>9} {'mode':>8} {'p50 ms':>8} {'p95 ms':>8} {'recall@5':>9} {'people':>7} "
              f"{'vehicles':>9}   server median steps ms")
        for size, results in rows:
            for mode, r in results.items():
                steps = ", ".join(f"{k} {v:.1f}" for k, v in r["steps"].items())
                print(f"{size:>9,} {mode:>8} {r['p50']:>8.1f} {r['p95']:>8.1f} {r['recall']:>9.2f} "
                      f"{r['people']:>7.2f} {r['vehicles']:>9.2f}   {steps}")
            best_single = max(results["keyword"]["recall"], results["vector"]["recall"])
            print(f"{'':>9} hybrid recall / best single method: {results['hybrid']['recall'] / best_single:.2f}x")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------- search under load (--load-sessions)


async def av_clients(url: str, count: int) -> None:
    """Child process: ``count`` audio+video sessions. Prints ``ready``, waits for ``stop`` on stdin, then prints
    one JSON line: how many sessions were still connected."""
    import json

    from bench.capacity import CAMERA_FPS, PrecodedVideoTrack, precoded_vp8
    from server.cli.client import VigilClient, connect_when_admitted
    from server.media.ice import restrict_host_addresses
    from tests.support.audio import ScriptedMicrophone

    restrict_host_addresses(["127.0.0.1"])
    packets = precoded_vp8((640, 360), CAMERA_FPS)
    clients: list[VigilClient] = []
    for _ in range(count):  # a burst is let in a few at a time (sessions.max_starting_sessions): wait those out
        holder = [VigilClient(url)]

        def renew(holder: list[VigilClient] = holder) -> None:
            holder[0] = VigilClient(url)

        await connect_when_admitted(lambda holder=holder: holder[0].connect(
            [ScriptedMicrophone(noise=30.0), PrecodedVideoTrack(packets, CAMERA_FPS)], timeout=60), renew)
        clients.append(holder[0])
    print("ready", flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.readline)
    alive = sum(c.pc.connectionState == "connected" for c in clients)
    print(json.dumps({"alive": alive, "sessions": count}), flush=True)
    for client in clients:
        try:
            await asyncio.wait_for(client.close(), 10)
        except Exception:  # a session the server already closed
            pass


async def search_rate(url: str, questions: list[str], rate: float, seconds: float) -> dict[str, Any]:
    """Open loop: one GET /api/search every 1/rate s for ``seconds``; each request's status and client-side ms."""
    results: list[tuple[int, float]] = []

    async def one(http: aiohttp.ClientSession, question: str) -> None:
        started = time.perf_counter()
        try:
            async with http.get(f"{url}/api/search", params={"q": question, "limit": "5"},
                                timeout=aiohttp.ClientTimeout(total=120)) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError):
            status = 0
        results.append((status, (time.perf_counter() - started) * 1000.0))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        tasks = []
        begin = time.perf_counter()
        count = int(rate * seconds)
        for number in range(count):
            delay = begin + number / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(http, questions[number % len(questions)])))
        await asyncio.gather(*tasks)
    ok = [ms for status, ms in results if status == 200]
    return {"sent": count, "ok": len(ok), "shed": sum(s == 503 for s, _ in results),
            "other": sum(s not in (200, 503) for s, _ in results),
            "p50": percentile(ok, 0.5) if ok else float("nan"), "p95": percentile(ok, 0.95) if ok else float("nan"),
            "shed_p95": percentile([ms for s, ms in results if s == 503], 0.95) if any(s == 503 for s, _ in results)
            else float("nan")}


async def under_load(args: argparse.Namespace) -> None:
    from models.embeddings import MiniLmEmbedder

    root = Path(tempfile.mkdtemp(prefix="vigil-bench-search-load-"))
    pairs = needles(args.questions)
    fillers = filler_texts(args.load_corpus)
    entries = corpus(len(pairs) + len(fillers), pairs, fillers)
    embedder = MiniLmEmbedder()  # real embeddings of a small corpus (seconds): the server searches them
    index = MemoryIndex(root / "memory", lambda: embedder,
                        lambda dim: LanceVectors(root / "memory" / "vectors.lance", "vigil_memory", dim),
                        queue_max=len(entries) + 1, batch_max=256)
    index.start()
    index.add(entries)
    await index.flush()
    await index.close()
    config: dict[str, Any] = {"webrtc": {"host_addresses": ["127.0.0.1"], "offer_rate_limit": None},
                              "grpc": {"port": 0}, "sessions": {"max_sessions": args.load_sessions + 2},
                              "memory": {"enabled": True, "data_dir": str(root / "memory")},
                              "storage": {"data_dir": str(root / "timeline")}}  # everything else: the defaults
    vigil_root: Path = args.vigil_root or REPO
    server = await asyncio.to_thread(VigilProcess(root, config, root=vigil_root).start)
    questions = [question for _, question in pairs]
    clients: asyncio.subprocess.Process | None = None
    try:
        async with aiohttp.ClientSession() as http:  # the first search loads MiniLM in the server
            for _ in range(120):
                async with http.get(f"{server.url}/api/search", params={"q": "warm up"}) as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(1)
        alone = await search_rate(server.url, questions, args.load_rate, args.load_seconds)
        clients = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.search", "--av-clients", str(args.load_sessions), "--url", server.url,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO)
        assert clients.stdout is not None and clients.stdin is not None
        ready = (await asyncio.wait_for(clients.stdout.readline(), 300)).decode().strip()
        assert ready == "ready", ready
        await asyncio.sleep(args.load_warmup_s)
        loaded = await search_rate(server.url, questions, args.load_rate, args.load_seconds)
        clients.stdin.write(b"stop\n")
        await clients.stdin.drain()
        import json

        alive = json.loads((await asyncio.wait_for(clients.stdout.readline(), 120)).decode())
        await asyncio.wait_for(clients.wait(), 60)
    finally:
        if clients is not None and clients.returncode is None:
            clients.kill()
            await clients.wait()
        await asyncio.to_thread(server.stop)
        shutil.rmtree(root, ignore_errors=True)
    print(f"\nGET /api/search (hybrid, limit 5) at {args.load_rate:g}/s for {args.load_seconds:g} s, open loop; "
          f"{len(entries):,} entries; server: {vigil_root}")
    print(f"{'':>24} {'sent':>5} {'200':>5} {'503':>5} {'other':>5} {'p50 ms':>8} {'p95 ms':>8} {'503 p95 ms':>10}")
    for name, r in (("alone", alone), (f"{args.load_sessions} a+v sessions", loaded)):
        print(f"{name:>24} {r['sent']:>5} {r['ok']:>5} {r['shed']:>5} {r['other']:>5} {r['p50']:>8.0f} "
              f"{r['p95']:>8.0f} {r['shed_p95']:>10.0f}")
    print(f"sessions still connected at the end: {alive['alive']}/{alive['sessions']}; "
          f"load average {os.getloadavg()[0]:.1f}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--questions", type=int, default=200, help="needle facts, one paraphrased question each")
    parser.add_argument("--ingest", type=int, default=500, help="fresh entries for the embedding ingestion rate")
    parser.add_argument("--load-sessions", type=int, default=0,
                        help="measure search under N WebRTC audio+video sessions instead (see above)")
    parser.add_argument("--load-rate", type=float, default=20.0, help="searches per second (open loop)")
    parser.add_argument("--load-seconds", type=float, default=15.0, help="how long each phase searches")
    parser.add_argument("--load-warmup-s", type=float, default=5.0, help="sessions running before searching")
    parser.add_argument("--load-corpus", type=int, default=2000, help="filler entries in the server's memory")
    parser.add_argument("--vigil-root", type=lambda value: Path(value).resolve(),
                        help="serve this checkout instead (a before/after comparison)")
    parser.add_argument("--av-clients", type=int, help=argparse.SUPPRESS)  # the child process of --load-sessions
    parser.add_argument("--url", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args()
    if options.av_clients is not None:
        asyncio.run(av_clients(options.url, options.av_clients))
    elif options.load_sessions:
        asyncio.run(under_load(options))
    else:
        asyncio.run(main(options))
