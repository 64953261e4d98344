"""Test and bench helpers for a cluster of ``vigil serve`` processes (tests/integration/test_cluster.py,
bench/capacity.py): a node's config, and waiting, from the outside like a client, for a source to run and its
results to flow."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.support.vigil_process import VigilProcess


def node_config(redis_url: str, name: str, media_root: Path, *, heartbeat_s: float, lease_s: float,
                reconnect_max_s: float) -> dict[str, Any]:
    """A light node (no detector, no voice loop: the cluster tests are about placement), on loopback."""
    return {
        "cluster": {"redis_url": redis_url, "node_id": name, "heartbeat_s": heartbeat_s, "lease_s": lease_s,
                    "node_ttl_s": lease_s},
        "models": {"detector": {"backend": "none"}},
        "voice": {"enabled": False},
        "sources": {"media_root": str(media_root), "reconnect_initial_s": 0.2, "reconnect_max_s": reconnect_max_s},
        "sessions": {"metrics_interval_s": 0.25},
        "webrtc": {"host_addresses": ["127.0.0.1"]},
        "grpc": {"port": 0},
    }


def node_name(node: VigilProcess) -> str:
    return json.loads(node.config_path.read_text())["cluster"]["node_id"]


async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    async with http.get(url) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def owner_of(http: aiohttp.ClientSession, nodes: list[VigilProcess], source_id: str, *,
                   not_on: str | None = None, timeout: float) -> tuple[str, VigilProcess]:
    """Wait until the cluster (asked through ``nodes[0]``) lists the source as live on one of ``nodes`` (other
    than ``not_on``)."""
    by_name = {node_name(node): node for node in nodes}
    deadline = time.monotonic() + timeout
    while True:
        listing = await get_json(http, f"{nodes[0].url}/api/sources")
        for source in listing["sources"]:
            if source["id"] == source_id and source["node"] in by_name and source["node"] != not_on \
                    and source["state"] == "live":
                return source["node"], by_name[source["node"]]
        assert time.monotonic() < deadline, f"source not live on a node within {timeout} s: {listing}"
        await asyncio.sleep(0.1)


async def results_flow(http: aiohttp.ClientSession, node: VigilProcess, source_id: str, *, timeout: float) -> None:
    """Frames from the camera reach the source's pipeline on ``node``: two of its metrics messages, the second
    counting more frames than the first."""
    async with http.ws_connect(f"{node.url}/api/sources/{source_id}/results") as ws:
        first: int | None = None
        async with asyncio.timeout(timeout):
            async for msg in ws:
                message = json.loads(msg.data)
                if message["type"] == "metrics" and message.get("media"):
                    frames = message["media"]["video"]["frames_in"]
                    if first is None:
                        first = frames
                    elif frames > first:
                        return
        raise AssertionError("the results socket closed before frames flowed")
