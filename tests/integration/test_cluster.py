"""Several ``vigil serve`` processes as one cluster through a real ``redis-server``, with a real RTSP camera:
placement, cluster-wide listings, takeover after SIGKILL, drain (CLI and SIGTERM), and Redis going away."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.cluster import get_json, node_config, node_name, owner_of, results_flow
from tests.support.redis_server import RedisServer
from tests.support.rtsp import RtspCamera
from tests.support.vigil_process import VigilProcess

REPO_ROOT = Path(__file__).resolve().parents[2]
HEARTBEAT_S, LEASE_S = 0.5, 2.0
RECONNECT_MAX_S = 1.0
DRAIN_TIMEOUT_S = 30.0  # cluster.drain_timeout_s's default
# A source must be running again within its lease + one pass + the camera's reconnect; the rest is margin for
# a loaded 2-core machine (process start-up is not part of it: the nodes are already up).
BOUND_S = LEASE_S + HEARTBEAT_S + RECONNECT_MAX_S + 12.0


@pytest.fixture
def camera() -> Iterator[RtspCamera]:
    with RtspCamera(fps=10) as cam:
        yield cam
        # A camera that died mid-test shows up as sources stuck 'reconnecting'; say so, with its own words.
        assert cam.running, f"the RTSP camera died during the test: {cam.error_output()[-2000:]}"


@pytest.fixture
async def start_nodes(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[Any]:
    started: list[VigilProcess] = []

    async def start(*names: str, max_sources: int | None = None) -> list[VigilProcess]:
        configs = [node_config(redis_server.url, name, tmp_path, heartbeat_s=HEARTBEAT_S, lease_s=LEASE_S,
                               reconnect_max_s=RECONNECT_MAX_S) for name in names]
        if max_sources is not None:
            for config in configs:
                config["sessions"]["max_sources"] = max_sources
        nodes = [VigilProcess(tmp_path, config) for config in configs]
        started.extend(nodes)  # before starting: if one fails to start, the others are still stopped
        await asyncio.gather(*(asyncio.to_thread(node.start) for node in nodes))
        return nodes

    yield start
    for node in started:
        node.stop()


async def _metrics(http: aiohttp.ClientSession, node: VigilProcess) -> str:
    async with http.get(f"{node.url}/metrics") as response:
        return await response.text()


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def _metric_or_zero(text: str, name: str) -> float:
    """A labelled counter is absent from /metrics until it first counts."""
    try:
        return _metric(text, name)
    except AssertionError:
        return 0.0


def _passes(text: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vigil_cluster_passes_total{"))


async def _listings_agree(http: aiohttp.ClientSession, nodes: list[VigilProcess]) -> list[tuple[str, str]]:
    views = []
    for node in nodes:
        listing = await get_json(http, f"{node.url}/api/sources")
        assert listing["partial"] is False
        views.append(sorted((s["id"], s["node"]) for s in listing["sources"]))
    assert all(view == views[0] for view in views), views
    return views[0]


async def test_a_source_survives_its_nodes_death_and_moves_on_drain(start_nodes, camera: RtspCamera):
    a, b, c = await start_nodes("a", "b", "c")
    async with aiohttp.ClientSession() as http:
        nodes = (await get_json(http, f"{b.url}/api/cluster/nodes"))["nodes"]
        assert sorted(n["id"] for n in nodes) == ["a", "b", "c"]
        async with http.post(f"{a.url}/api/sources", json={"url": camera.url, "name": "door"}) as response:
            created = await response.json()
            assert response.status == 201, created
        source_id = created["id"]
        owner_name, owner = await owner_of(http, [a, b, c], source_id, timeout=BOUND_S)
        await results_flow(http, owner, source_id, timeout=BOUND_S)
        deadline = time.monotonic() + 5
        while True:  # every node's list shows the one source on its node (snapshots are one heartbeat old)
            try:
                assert await _listings_agree(http, [a, b, c]) == [(source_id, owner_name)]
                break
            except AssertionError:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.2)
        # Asking a node that does not run it for its results says where it runs.
        other = next(node for node in (a, b, c) if node is not owner)
        async with http.get(f"{other.url}/api/sources/{source_id}/scene") as response:
            assert response.status == 409 and owner_name in (await response.json())["error"]["message"]
        remote = await get_json(http, f"{other.url}/api/sources/{source_id}")
        assert remote["node"] == owner_name and remote["name"] == "door" and camera.url in remote["location"]

        # SIGKILL the owner: another node takes the source over within the bound.
        killed_at = time.monotonic()
        owner.process.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
        owner.process.wait()  # type: ignore[union-attr]
        survivors = [node for node in (a, b, c) if node is not owner]
        second_name, second = await owner_of(http, survivors, source_id, not_on=owner_name, timeout=BOUND_S)
        await results_flow(http, second, source_id, timeout=BOUND_S)
        assert time.monotonic() - killed_at < BOUND_S
        assert await _listings_agree(http, survivors) == [(source_id, second_name)]
        metrics = await _metrics(http, second)
        assert _metric(metrics, 'vigil_cluster_sources_taken_total{reason="takeover"}') == 1
        # The survivors looked right when the lease ran out (not up to a heartbeat later), and the new owner
        # published the source's new state at once (not at its next heartbeat). Either survivor may take it: a
        # pass at the lease's last millisecond can find the key still there and lose it to the other's heartbeat.
        expiry = 'vigil_cluster_passes_total{trigger="lease_expiry"}'
        expiry_passes = [_metric_or_zero(await _metrics(http, node), expiry) for node in survivors]
        assert sum(expiry_passes) >= 1, expiry_passes
        assert _metric(metrics, 'vigil_cluster_passes_total{trigger="source_state"}') >= 1

        # Drain the new owner with the CLI: the last node takes over, with no gap longer than the bound.
        drained_at = time.monotonic()
        done = await asyncio.to_thread(subprocess.run, [sys.executable, "-m", "server.cli", "drain", "--url",
                                                        second.url], cwd=REPO_ROOT, capture_output=True, text=True,
                                       timeout=120)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["handed_over"] == [source_id]
        third_name, third = await owner_of(http, survivors, source_id, not_on=second_name, timeout=BOUND_S)
        await results_flow(http, third, source_id, timeout=BOUND_S)
        assert time.monotonic() - drained_at < BOUND_S
        # A draining node takes nothing new: a source created through it goes elsewhere.
        async with http.post(f"{second.url}/api/sources", json={"url": camera.url}) as response:
            assert response.status == 201
            assert (await response.json())["node"] == third_name
        # DELETE through any node stops it where it runs.
        async with http.delete(f"{second.url}/api/sources/{source_id}") as response:
            assert response.status == 204
        deadline = time.monotonic() + 10
        while source_id in [s["id"] for s in (await get_json(http, f"{third.url}/api/sources"))["sources"]]:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)


async def test_sigterm_hands_sources_over_before_exit(start_nodes, camera: RtspCamera):
    a, b = await start_nodes("a", "b")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{b.url}/api/sources", json={"url": camera.url}) as response:
            source_id = (await response.json())["id"]
        owner_name, owner = await owner_of(http, [a, b], source_id, timeout=BOUND_S)
        other_name, other = ("b", b) if owner_name == "a" else ("a", a)
        stopped_at = time.monotonic()
        owner.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert await asyncio.to_thread(owner.process.wait, 60) == 0  # type: ignore[union-attr]
        # The hand-over happened before exit: the source already holds a lease on the other node.
        listing = await get_json(http, f"{other.url}/api/sources")
        assert [(s["id"], s["node"]) for s in listing["sources"]] == [(source_id, other_name)]
        await owner_of(http, [other], source_id, timeout=BOUND_S)
        await results_flow(http, other, source_id, timeout=BOUND_S)
        assert time.monotonic() - stopped_at < BOUND_S


async def test_redis_down_keeps_sources_refuses_placements_and_rejoins(start_nodes, redis_server: RedisServer,
                                                                       camera: RtspCamera):
    a, b = await start_nodes("a", "b")
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{a.url}/api/sources", json={"url": camera.url}) as response:
            source_id = (await response.json())["id"]
        owner_name, owner = await owner_of(http, [a, b], source_id, timeout=BOUND_S)
        other = b if owner is a else a
        # The other node knows when the owner's lease runs out: an expiry that lies in the past once Redis is gone
        # must not become a pass every few milliseconds (it did: ~170 failed passes a second).
        passes_before, down_at = _passes(await _metrics(http, other)), time.monotonic()
        redis_server.stop()
        await asyncio.sleep(LEASE_S + 2 * HEARTBEAT_S)  # leases and heartbeats have lapsed by now
        passes = _passes(await _metrics(http, other)) - passes_before
        assert passes <= (time.monotonic() - down_at) / HEARTBEAT_S + 3, passes  # a pass per heartbeat at most
        # Still serving what it has.
        await results_flow(http, owner, source_id, timeout=BOUND_S)
        for node in (a, b):
            async with http.post(f"{node.url}/api/sources", json={"url": camera.url}) as response:
                assert response.status == 503
                error = (await response.json())["error"]
                assert error["code"] == "cluster_unavailable" and "Redis" in error["message"]
            async with http.post(f"{node.url}/api/cluster/drain") as response:  # nothing handed over, nothing stopped
                assert response.status == 503 and (await response.json())["error"]["code"] == "cluster_unavailable"
            listing = await get_json(http, f"{node.url}/api/sources")
            assert listing["partial"] is True
            assert _metric(await _metrics(http, node), "vigil_cluster_redis_up") == 0
            expected = [(source_id, owner_name)] if node is owner else []
            assert [(s["id"], s["node"]) for s in listing["sources"]] == expected
        # Redis comes back empty (no persistence): the nodes rejoin and re-assert what they run.
        await asyncio.to_thread(redis_server.start)
        deadline = time.monotonic() + 20
        while True:  # every node reconnects on its own next pass: wait until both list the whole cluster again
            listings = [await get_json(http, f"{node.url}/api/sources") for node in (a, b)]
            if all(not listing["partial"] and [(s["id"], s["node"]) for s in listing["sources"]] == [
                    (source_id, owner_name)] for listing in listings):
                break
            assert time.monotonic() < deadline, listings
            await asyncio.sleep(0.2)
        async with http.post(f"{b.url}/api/sources", json={"url": camera.url}) as response:
            assert response.status == 201, await response.text()
        await results_flow(http, owner, source_id, timeout=BOUND_S)
        async with asyncio.timeout(BOUND_S):  # a pooled connection that died with Redis fails once, then is renewed
            while True:
                async with http.get(f"{a.url}/api/cluster/nodes") as response:
                    if response.status == 200:
                        assert sorted(n["id"] for n in (await response.json())["nodes"]) == ["a", "b"]
                        break
                    assert (await response.json())["error"]["code"] == "cluster_unavailable"
                await asyncio.sleep(0.2)


async def test_the_cluster_source_limit_holds_under_parallel_posts(start_nodes, camera: RtspCamera):
    """Two nodes of one source each, ten parallel POSTs through both: exactly two are placed (one per node), the
    rest are refused with 429 ``too_many_sources``, and the cluster runs exactly those two. A drain with no room
    elsewhere keeps its source placed for the next free slot."""
    a, b = await start_nodes("a", "b", max_sources=1)
    async with aiohttp.ClientSession() as http:

        async def post(node: VigilProcess) -> tuple[int, dict[str, Any]]:
            async with http.post(f"{node.url}/api/sources", json={"url": camera.url}) as response:
                return response.status, await response.json()

        answers = await asyncio.gather(*(post(a if i % 2 else b) for i in range(10)))
        statuses = sorted(status for status, _ in answers)
        assert statuses == [201] * 2 + [429] * 8, answers
        for status, body in answers:
            if status == 429:
                assert body["error"]["code"] == "too_many_sources" and body["error"]["message"], body
        created = sorted((body["id"], body["node"]) for status, body in answers if status == 201)
        assert sorted(node for _, node in created) == ["a", "b"], created  # one per node: each can run it
        listing = await get_json(http, f"{a.url}/api/sources")
        assert sorted(s["id"] for s in listing["sources"]) == [source_id for source_id, _ in created]
        for source_id, node_id in created:
            assert (await owner_of(http, [a, b], source_id, timeout=BOUND_S))[0] == node_id
        # Still serving: a slot freed by DELETE is placed again.
        async with http.delete(f"{b.url}/api/sources/{created[0][0]}") as response:
            assert response.status == 204
        status, body = await post(a)
        assert status == 201, body
        placed = {created[1][0]: created[1][1], body["id"]: body["node"]}
        for source_id, node_id in placed.items():
            assert (await owner_of(http, [a, b], source_id, timeout=BOUND_S))[0] == node_id
        on_a, on_b = (next(sid for sid, node_id in placed.items() if node_id == name) for name in ("a", "b"))

        # Draining a when b is full hands nothing to b (it could not run it) and does not wait for it: the source
        # is named not taken, stays placed, and runs on b as soon as b has room.
        async with http.post(f"{a.url}/api/cluster/drain") as response:
            drained = await response.json()
            assert response.status == 200, drained
        assert drained == {"node": "a", "handed_over": [], "not_taken": [on_a]}, drained
        listing = await get_json(http, f"{b.url}/api/sources")
        assert sorted(s["id"] for s in listing["sources"]) == sorted(placed), listing
        async with http.delete(f"{b.url}/api/sources/{on_b}") as response:
            assert response.status == 204
        assert (await owner_of(http, [b], on_a, timeout=BOUND_S))[0] == "b"


async def test_sessions_are_listed_cluster_wide_and_stay_where_they_were_answered(start_nodes):
    from server.cli.client import VigilClient
    from server.media.ice import restrict_host_addresses

    restrict_host_addresses(["127.0.0.1"])  # this process's aiortc client, like the nodes, offers loopback
    a, b = await start_nodes("a", "b")
    client = VigilClient(a.url)
    await client.connect()
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 10
            while True:  # b learns of a's session from a's next heartbeat
                listing = await get_json(http, f"{b.url}/api/sessions")
                if [(s["id"], s["node"]) for s in listing["sessions"]] == [(client.session_id, "a")]:
                    break
                assert time.monotonic() < deadline, listing
                await asyncio.sleep(0.1)
            one = await get_json(http, f"{b.url}/api/sessions/{client.session_id}")
            assert one["node"] == "a" and one["connection_state"] == "connected"
            local = await get_json(http, f"{a.url}/api/sessions")
            assert [(s["id"], s["node"]) for s in local["sessions"]] == [(client.session_id, "a")]
            nodes = {n["id"]: n for n in (await get_json(http, f"{b.url}/api/cluster/nodes"))["nodes"]}
            deadline = time.monotonic() + 10
            while nodes["a"]["load"]["sessions"] != 1:
                assert time.monotonic() < deadline, nodes
                await asyncio.sleep(0.2)
                nodes = {n["id"]: n for n in (await get_json(http, f"{b.url}/api/cluster/nodes"))["nodes"]}
            assert nodes["b"]["load"]["sessions"] == 0
            assert {"cpu", "analysed_fps", "sources"} <= nodes["a"]["load"].keys()
    finally:
        await client.close()


async def test_openapi_documents_the_cluster_routes_a_node_serves(start_nodes):
    (a,) = await start_nodes("a")
    async with aiohttp.ClientSession() as http:
        document = await get_json(http, f"{a.url}/openapi.json")
        paths = document["paths"]
        assert {"/api/cluster/nodes", "/api/cluster/drain"} <= paths.keys()
        assert "get" in paths["/api/cluster/nodes"] and "post" in paths["/api/cluster/drain"]
        # the source and session endpoints the cluster answers are documented once, as before
        assert {"/api/sources", "/api/sessions", "/api/sources/{source_id}"} <= paths.keys()
        nodes = await get_json(http, f"{a.url}/api/cluster/nodes")
        assert [n["id"] for n in nodes["nodes"]] == ["a"] and nodes["nodes"][0]["self"] is True


async def test_nodes_stopped_together_exit_without_waiting_on_each_other(start_nodes, camera: RtspCamera):
    """Every node of a cluster stopped at once (``docker compose down``, a host's shutdown): each drain reads who
    is still there when it starts and stops waiting for a node that began draining or left since, so none waits
    out ``drain_timeout_s`` (30 s) for a hand-over the other will never take. Each source stays placed, and the next
    node up takes it (as after a node's death)."""
    a, b = await start_nodes("a", "b")
    async with aiohttp.ClientSession() as http:
        for node in (a, b):
            async with http.post(f"{node.url}/api/sources", json={"url": camera.url}) as response:
                assert response.status == 201, await response.text()
        listing = await get_json(http, f"{a.url}/api/sources")
        for source in listing["sources"]:
            await owner_of(http, [a, b], source["id"], timeout=BOUND_S)
    started = time.monotonic()
    for node in (a, b):
        node.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    for node in (a, b):
        assert await asyncio.to_thread(node.process.wait, 60) == 0  # type: ignore[union-attr]
    # Each waited drain_timeout_s (30 s) before the fix; a handover to a node still running is a pass or two.
    assert time.monotonic() - started < DRAIN_TIMEOUT_S / 2, (a.log(), b.log())
    for node in (a, b):
        assert f"cluster: node {node_name(node)} leaves" in node.log(0), node.log()
