"""Many Vigil nodes as one: server-side sources placed on the least-loaded live node, held by a lease in Redis,
taken over when their node dies, handed over when it drains. WebRTC sessions stay on the node that answered the
offer (a least-connections load balancer in front spreads them); they are only listed cluster-wide.

Redis holds (keys under ``cluster.key_prefix``):

- ``nodes`` (set of node ids) and ``node:<id>`` (JSON: URL, load, draining, and a snapshot of the node's sources
  and sessions for cluster-wide listings), written every ``heartbeat_s`` with a ``node_ttl_s`` expiry: a node
  whose key has expired is dead.
- ``sources`` (hash: source id → spec JSON: the ``POST /api/sources`` body, the node it was placed on): what the
  cluster should be running. Deleting a source removes its spec; its owner stops it on its next pass.
- ``lease:<source id>`` (value: the owner's node id, ``lease_s`` expiry), renewed by the owner every pass.

Every node runs the same pass (``_tick``): heartbeat, renew its leases (a lease found taken by another node stops
the local copy), stop sources whose spec is gone, and take unleased specs: the node a spec was placed on at once,
otherwise the live nodes in order of load, each waiting ``rank × heartbeat_s`` so that the least-loaded one wins.
A node that loses Redis keeps running what it has, refuses new placements (503 ``cluster_unavailable``) and, when
Redis is back, re-asserts its specs and leases (``SET NX``: one that another node took meanwhile is stopped here).
Redis is the one coordination point (already a dependency for shared rate limits); leases with expiry are the
usual Redis pattern for single-owner work, no consensus protocol of our own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, NoReturn

import redis.asyncio as aioredis
from aiohttp import web
from prometheus_client import Counter, Gauge

from pipelines.protocol import MediaCounts
from pipelines.sources.container import SourceState
from server.config import Settings
from server.http.errors import ApiError
from server.media.routes import SessionInfo, SourceInfo
from server.media.sessions import SessionRegistry
from server.media.sources import (
    SourceManager,
    SourceRequest,
    redact_url,
    resolve_media_path,
)

log = logging.getLogger(__name__)

REDIS_UP = Gauge("vigil_cluster_redis_up", "1 while this node reaches the cluster's Redis.")
LIVE_NODES = Gauge("vigil_cluster_live_nodes", "Live nodes this node sees in the cluster.")
SOURCES_TAKEN = Counter("vigil_cluster_sources_taken_total", "Sources this node started under a lease, by why.",
                        ["reason"])

PASSES = Counter("vigil_cluster_passes_total", "Cluster passes by what started them (heartbeat, "
                 "lease_expiry: another node's lease ran out, source_state: a local source changed state).",
                 ["trigger"])


_RENEW = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('pexpire', KEYS[1], ARGV[2]) end
return 0"""
_RELEASE = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""
# Place a source atomically: count the specs per node (the lease holder's, or the node it was placed on while
# unleased) and in total, then HSET the spec for the first candidate (in load order) with room. Counting and
# writing in one script is what makes the limit hold under parallel POSTs (a check in Python followed by an
# awaited HSET lets every one of them through). The lease keys are read by name: fine on a single Redis.
# KEYS[1]: the sources hash. ARGV: capacity, per-node limit, lease key prefix, source id, then pairs of
# (candidate node id, the spec JSON placed on it). Returns the node chosen, or false when there is no room.
# A drain hands its sources over through it too (with _NO_TOTAL_LIMIT: a source moved is already counted).
_PLACE = """local specs = redis.call('hgetall', KEYS[1])
local capacity, per_node = tonumber(ARGV[1]), tonumber(ARGV[2])
if #specs / 2 >= capacity then return false end
local held = {}
for i = 1, #specs, 2 do
  local owner = redis.call('get', ARGV[3] .. specs[i])
  if not owner then owner = cjson.decode(specs[i + 1]).node end
  if owner then held[owner] = (held[owner] or 0) + 1 end
end
for j = 5, #ARGV, 2 do
  if (held[ARGV[j]] or 0) < per_node then
    redis.call('hset', KEYS[1], ARGV[4], ARGV[j + 1])
    return ARGV[j]
  end
end
return false"""

_NO_TOTAL_LIMIT = 2**53  # beyond any count of specs


def _unavailable() -> ApiError:
    return ApiError("cluster_unavailable", "the cluster's Redis cannot be reached: new sources cannot be placed now "
                    "(sources already running keep running); try again when it is back")


class ClusterUnavailable(Exception):
    """Redis cannot be reached: the cluster view is unknown, so nothing new is placed."""


@dataclass
class NodeView:
    id: str
    url: str
    draining: bool
    load: dict[str, float]
    sources: list[dict[str, Any]] = field(default_factory=list)
    sessions: list[dict[str, Any]] = field(default_factory=list)

    @property
    def score(self) -> tuple[float, float]:
        return (self.load.get("sources", 0) + self.load.get("sessions", 0), self.load.get("cpu", 0.0))


def _default_identity(settings: Settings) -> tuple[str, str]:
    hostname = socket.gethostname()
    host = settings.server.host if settings.server.host not in ("", "0.0.0.0", "::") else hostname
    node_id = settings.cluster.node_id or f"{hostname}:{settings.server.port}"
    return node_id, settings.cluster.advertise_url or f"http://{host}:{settings.server.port}"


class ClusterNode:
    """This process as a cluster member. ``start`` on the app's startup, ``leave`` on its shutdown."""

    EXPIRY_MARGIN_S = 0.005  # look just after a lease's expiry, not just before it
    MIN_PASS_INTERVAL_S = 0.05  # never two passes closer than this, whatever asked for the next one

    def __init__(self, settings: Settings, sessions: SessionRegistry, sources: SourceManager) -> None:
        assert settings.cluster.redis_url is not None
        self.settings, self.config = settings, settings.cluster
        self.sessions, self.sources = sessions, sources
        self.node_id, self.url = _default_identity(settings)
        self.prefix = self.config.key_prefix
        self.redis = aioredis.from_url(
            self.config.redis_url.get_secret_value(),  # type: ignore[union-attr]
            socket_timeout=self.config.redis_timeout_s, socket_connect_timeout=self.config.redis_timeout_s,
            decode_responses=True,
        )
        self.connected = False
        self.draining = False
        self.local_specs: dict[str, dict[str, Any]] = {}  # cluster sources running here: id -> spec
        self._unowned_since: dict[str, float] = {}
        self._nodes: dict[str, NodeView] = {}
        self._task: asyncio.Task[None] | None = None
        self._tick_lock = asyncio.Lock()
        self._cpu_mark = (time.monotonic(), time.process_time())
        self._frames_mark: tuple[float, int] = (time.monotonic(), 0)
        self._load: dict[str, float] = {}
        self._lease_expires_at: float | None = None  # monotonic time the soonest other node's lease runs out
        self._wake = asyncio.Event()  # an early pass: a local source changed state
        sources.state_listeners.append(self._source_state_changed)  # a listener, as the timeline's are

    # ------------------------------------------------------------------ keys

    def _key(self, *parts: str) -> str:
        return self.prefix + ":".join(parts)

    @property
    def _ms(self) -> int:
        return int(self.config.lease_s * 1000)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        with contextlib.suppress(ClusterUnavailable):
            await self.tick()
        self._task = asyncio.create_task(self._run(), name="cluster")

    async def _run(self) -> None:
        failed = False
        while True:
            delay = self._next_pass_in(failed)
            trigger = "lease_expiry" if delay < self.config.heartbeat_s else "heartbeat"
            try:
                await asyncio.wait_for(self._wake.wait(), delay)
                trigger = "source_state"
            except TimeoutError:
                pass
            self._wake.clear()
            PASSES.labels(trigger=trigger).inc()
            started = time.monotonic()
            try:
                await self.tick()
                failed = False
            except ClusterUnavailable:
                failed = True
            # A pass asked for at once (a state change, a lease just out) still waits out the minimum interval.
            await asyncio.sleep(max(0.0, self.MIN_PASS_INTERVAL_S - (time.monotonic() - started)))

    def _source_state_changed(self, source_id: str, state: SourceState) -> None:
        """A source running here changed state (e.g. live after a takeover): publish it now, not a heartbeat
        later, so that every node's listing shows where it runs and how it is at once."""
        if source_id in self.local_specs:
            self._wake.set()

    def _next_pass_in(self, failed: bool = False) -> float:
        """One pass every ``heartbeat_s``, and one right after another node's lease runs out: a lease lapses only
        when its owner stopped renewing it for ``lease_s`` (as strict as before), but the source then moves at once
        instead of up to a heartbeat later. After a failed pass (Redis unreachable) the expiry seen before is
        stale, and may lie in the past (a pass every few ms, ~170 failed passes a second): back to the heartbeat,
        which is also how soon the node rejoins once Redis is back."""
        delay = self.config.heartbeat_s
        if failed and self._lease_expires_at is not None and self._lease_expires_at <= time.monotonic():
            self._lease_expires_at = None  # seen before the failure and past: no reason to try again at once
        if self._lease_expires_at is not None:
            delay = min(delay, max(0.0, self._lease_expires_at - time.monotonic()) + self.EXPIRY_MARGIN_S)
        return max(delay, self.MIN_PASS_INTERVAL_S)

    async def leave(self) -> None:
        """On shutdown (SIGTERM included): hand the sources over, then leave the cluster."""
        if self._task is not None:
            try:
                drained = await self.drain()
                log.info("cluster: node %s leaves, its sources handed over: %s; not taken (they stay placed): %s",
                         self.node_id, drained["handed_over"] or "none", drained["not_taken"] or "none")
            except ApiError as error:  # no other node, or no Redis: the sources stay placed for the next node up
                log.info("cluster: node %s leaves, its sources placed as they are: %s", self.node_id, error.message)
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        with contextlib.suppress(Exception):
            await self.redis.delete(self._key("node", self.node_id))
            await self.redis.srem(self._key("nodes"), self.node_id)
        await self.redis.aclose()

    # ------------------------------------------------------------------ the pass

    async def tick(self) -> None:
        async with self._tick_lock:
            try:
                await self._tick()
            except (aioredis.RedisError, OSError) as error:
                if self.connected:
                    log.warning("cluster: Redis unreachable (%s); serving what runs here, placing nothing new",
                                error)
                self.connected = False
                REDIS_UP.set(0)
                raise ClusterUnavailable(str(error)) from error

    async def _tick(self) -> None:
        rejoined = not self.connected
        sources = self.sources
        # 1. Our leases: renew; re-assert after an outage; a lease another node holds means that node runs it.
        for source_id, spec in list(self.local_specs.items()):
            renewed = await self.redis.eval(_RENEW, 1, self._key("lease", source_id), self.node_id, self._ms)
            if not renewed and not await self.redis.set(self._key("lease", source_id), self.node_id, nx=True,
                                                        px=self._ms):
                log.warning("cluster: source %s is now held by another node: stopping it here", source_id)
                await self._stop_local(source_id)
            elif rejoined:  # lease first, then the spec: no other node can see it unleased in between
                await self.redis.hsetnx(self._key("sources"), source_id, json.dumps(spec))
        if rejoined:
            log.info("cluster: node %s joined via Redis (%d sources here)", self.node_id, len(self.local_specs))
        self.connected = True
        REDIS_UP.set(1)
        # 2. Heartbeat with our load and a snapshot for cluster-wide listings.
        await self._publish()
        # 3. The cluster's view: live nodes, specs, leases.
        self._nodes = await self._read_nodes()
        LIVE_NODES.set(len(self._nodes))
        specs = {sid: json.loads(raw) for sid, raw in (await self.redis.hgetall(self._key("sources"))).items()}
        for source_id in list(self.local_specs):
            if source_id not in specs:  # deleted through another node
                await self._stop_local(source_id)
        if self.draining:
            self._lease_expires_at = None
            return
        unleased = await self._unleased(specs)
        now = time.monotonic()
        for source_id in list(self._unowned_since):
            if source_id not in unleased:
                del self._unowned_since[source_id]
        loads = {node.id: node.score for node in self._nodes.values() if not node.draining}
        for source_id in unleased:
            spec = specs[source_id]
            first_seen = self._unowned_since.setdefault(source_id, now)
            if len(sources) >= self.settings.sessions.max_sources:
                break
            assigned = spec.get("node")
            assignee_alive = assigned in loads
            if assigned != self.node_id:
                if assignee_alive and time.time() - spec.get("placed_at", 0) < self.config.lease_s:
                    continue  # placed on a live node that has not had its turn yet
                ranking = sorted(loads, key=lambda node_id: (loads[node_id], node_id))
                rank = ranking.index(self.node_id) if self.node_id in ranking else len(ranking)
                if now - first_seen < rank * self.config.heartbeat_s:
                    continue  # a less loaded node goes first
            if await self._take(source_id, spec):
                mine = loads.get(self.node_id, (0.0, 0.0))
                loads[self.node_id] = (mine[0] + 1, mine[1])

    async def _unleased(self, specs: dict[str, dict[str, Any]]) -> list[str]:
        """The specs nobody holds a lease on (oldest first); notes when the soonest other lease runs out."""
        ids = sorted((sid for sid in specs if sid not in self.local_specs),
                     key=lambda sid: specs[sid].get("created_at", 0))
        self._lease_expires_at = None
        if not ids:
            return []
        async with self.redis.pipeline(transaction=False) as pipe:
            for sid in ids:
                pipe.pttl(self._key("lease", sid))
            ttls = await pipe.execute()
        left_ms = [ttl for ttl in ttls if ttl >= 0]
        if left_ms:
            self._lease_expires_at = time.monotonic() + min(left_ms) / 1000.0
        return [sid for sid, ttl in zip(ids, ttls, strict=True) if ttl == -2]  # -2: no such key

    async def _take(self, source_id: str, spec: dict[str, Any]) -> bool:
        if not await self.redis.set(self._key("lease", source_id), self.node_id, nx=True, px=self._ms):
            return False
        try:
            request = SourceRequest.model_validate(spec["request"])
            self.sources.start(request, source_id=source_id)
        except Exception as error:  # e.g. the file is not under this node's media root: let another node try
            log.warning("cluster: cannot run source %s here: %s", source_id, error)
            await self.redis.eval(_RELEASE, 1, self._key("lease", source_id), self.node_id)
            return False
        self.local_specs[source_id] = spec
        self._unowned_since.pop(source_id, None)
        SOURCES_TAKEN.labels(reason="placed" if spec.get("node") == self.node_id else "takeover").inc()
        log.info("cluster: node %s runs source %s", self.node_id, source_id)
        return True

    async def _stop_local(self, source_id: str) -> None:
        self.local_specs.pop(source_id, None)
        await self.sources.stop(source_id)

    # ------------------------------------------------------------------ heartbeat

    def _measure_load(self) -> dict[str, float]:
        now, cpu = time.monotonic(), time.process_time()
        wall = max(now - self._cpu_mark[0], 1e-6)
        cpu_share = (cpu - self._cpu_mark[1]) / wall / (os.cpu_count() or 1)
        self._cpu_mark = (now, cpu)
        sources, sessions = self.sources, self.sessions
        frames = sum(s.pipeline.counts.video.frames_analyzed for s in sources.sources.values())
        frames += sum(s.pipeline.counts.video.frames_analyzed for s in sessions.sessions.values())
        fps = max(0, frames - self._frames_mark[1]) / max(now - self._frames_mark[0], 1e-6)
        self._frames_mark = (now, frames)
        return {"sources": len(sources), "sessions": len(sessions), "analysed_fps": round(fps, 2),
                "cpu": round(cpu_share, 4)}

    async def _publish(self) -> None:
        self._load = self._measure_load()
        record = {
            "id": self.node_id, "url": self.url, "draining": self.draining, "load": self._load, "ts": time.time(),
            "sources": [SourceInfo.model_validate({**s.describe(), "node": self.node_id}).model_dump(mode="json")
                        for s in self.sources.sources.values()],
            "sessions": [SessionInfo.model_validate({**s.describe(), "node": self.node_id}).model_dump(mode="json")
                         for s in self.sessions.sessions.values()],
        }
        ttl = int(self.config.node_ttl_s * 1000)
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(self._key("node", self.node_id), json.dumps(record), px=ttl)
            pipe.sadd(self._key("nodes"), self.node_id)
            await pipe.execute()

    async def _read_nodes(self) -> dict[str, NodeView]:
        ids = sorted(await self.redis.smembers(self._key("nodes")))
        if not ids:
            return {}
        raws = await self.redis.mget([self._key("node", node_id) for node_id in ids])
        nodes = {}
        for node_id, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue  # expired: dead (its id is pruned from the set by whoever notices)
            data = json.loads(raw)
            nodes[node_id] = NodeView(node_id, data["url"], data["draining"], data["load"], data["sources"],
                                      data["sessions"])
        dead = [node_id for node_id in ids if node_id not in nodes]
        if dead:
            await self.redis.srem(self._key("nodes"), *dead)
        return nodes

    # ------------------------------------------------------------------ API operations

    def _require(self) -> None:
        if not self.connected:
            raise _unavailable()

    def _redis_lost(self) -> NoReturn:
        """A request found Redis gone since the last pass: 503 cluster_unavailable, not a 500, until a pass finds
        it back."""
        self.connected = False
        REDIS_UP.set(0)
        raise _unavailable()

    async def create(self, body: SourceRequest) -> dict[str, Any]:
        """Validate here, place on the least-loaded live node, return the source's info (201)."""
        if body.path is not None:
            root = self.settings.sources.media_root
            real = resolve_media_path(root, body.path)  # MediaPathError → 400/403
            kind, shown = "file", str(real.relative_to(root.resolve()))
        else:
            assert body.url is not None
            kind, shown = "rtsp", redact_url(body.url)
        try:
            await self.tick()  # a fresh view of the nodes, and proof that Redis answers
        except ClusterUnavailable:
            self._require()
        candidates = [node for node in self._nodes.values() if not node.draining]
        if not candidates:
            raise ApiError("no_live_node", "no live, non-draining node can take a source")
        candidates.sort(key=lambda node: (node.score, node.id != self.node_id, node.id))
        limit = self.settings.sessions.max_sources
        capacity = limit * len(candidates)
        source_id = os.urandom(6).hex()
        spec = {"id": source_id, "request": body.model_dump(mode="json"), "kind": kind, "location": shown,
                "placed_at": time.time(), "created_at": time.time()}
        placements = [arg for node in candidates for arg in (node.id, json.dumps(spec | {"node": node.id}))]
        try:
            placed = await self.redis.eval(_PLACE, 1, self._key("sources"), capacity, limit, self._key("lease", ""),
                                           source_id, *placements)
            if not placed:
                raise ApiError("too_many_sources", f"the cluster's source limit is reached ({capacity})")
            spec["node"] = placed
            if placed == self.node_id:
                if await self._take(source_id, spec) or source_id in self.local_specs:  # (or our pass took it)
                    return self.sources.sources[source_id].describe() | {"node": self.node_id}
                if len(self.sources) >= limit:  # full here after all (a source not yet in Redis): refuse
                    await self.redis.hdel(self._key("sources"), source_id)
                    raise ApiError("too_many_sources", f"this node's source limit is reached ({limit})")
        except (aioredis.RedisError, OSError):
            self._redis_lost()
        return self._placeholder(spec, "placed")

    def _placeholder(self, spec: dict[str, Any], state: str, node: str | None = None) -> dict[str, Any]:
        request = SourceRequest.model_validate(spec["request"])
        config = self.settings.session_defaults()
        if request.options is not None:
            config = config.merged(request.options)
        return {"id": spec["id"], "kind": spec["kind"], "location": spec["location"], "name": request.name,
                "state": state, "state_detail": {}, "realtime": request.realtime, "loop": request.loop,
                "created_at": spec["created_at"], "subscribers": 0, "config": config.model_dump(),
                "counts": MediaCounts().model_dump(), "node": node or spec.get("node")}

    async def list_sources(self) -> tuple[list[dict[str, Any]], bool]:
        """Every cluster source with its node; (local ones only, True) while Redis is away."""
        local = {sid: s.describe() | {"node": self.node_id} for sid, s in self.sources.sources.items()}
        try:
            specs = await self.redis.hgetall(self._key("sources"))
            nodes = await self._read_nodes()
        except (aioredis.RedisError, OSError):
            return list(local.values()), True
        published = {s["id"]: s for node in nodes.values() if node.id != self.node_id for s in node.sources}
        out = [info for source_id, info in local.items() if source_id not in specs]  # not yet re-asserted
        for source_id, raw in specs.items():
            spec = json.loads(raw)
            out.append(local.get(source_id) or published.get(source_id) or self._placeholder(spec, "unassigned",
                                                                                               node=""))
        return sorted(out, key=lambda s: s["created_at"]), False

    async def list_sessions(self) -> tuple[list[dict[str, Any]], bool]:
        local = [s.describe() | {"node": self.node_id} for s in self.sessions.sessions.values()]
        try:
            nodes = await self._read_nodes()
        except (aioredis.RedisError, OSError):
            return local, True
        return local + [s for node in nodes.values() if node.id != self.node_id for s in node.sessions], False

    async def find_source(self, source_id: str) -> tuple[dict[str, Any], NodeView | None] | None:
        """A source not running here: (its info, the node running it, if any), or None if the cluster lacks it."""
        try:
            raw = await self.redis.hget(self._key("sources"), source_id)
            if raw is None:
                return None
            nodes = await self._read_nodes()
        except (aioredis.RedisError, OSError):
            self._redis_lost()
        for node in nodes.values():
            for info in node.sources:
                if info["id"] == source_id:
                    return info, node
        return self._placeholder(json.loads(raw), "unassigned", node=""), None

    async def delete(self, source_id: str) -> bool:
        try:
            removed = await self.redis.hdel(self._key("sources"), source_id)
            if source_id in self.local_specs:
                await self.redis.eval(_RELEASE, 1, self._key("lease", source_id), self.node_id)
        except (aioredis.RedisError, OSError):
            self._redis_lost()
        if source_id in self.local_specs:
            await self._stop_local(source_id)
            return True
        return bool(removed)

    async def drain(self) -> dict[str, Any]:
        """Stop taking sources; hand each local one to the least-loaded other node with room; wait until they run
        there. A source no node has room for is not waited for: it stays placed, and the next node with room
        takes it (as after a node's death)."""
        self._require()
        try:
            return await self._drain()
        except (aioredis.RedisError, OSError):
            self._redis_lost()

    async def _drain(self) -> dict[str, Any]:
        async with self._tick_lock:
            # Who is there now, not at the last pass: a node that left or began draining since (every node of a
            # cluster stopped at once) would never take what is handed to it.
            self._nodes = await self._read_nodes()
            others = [node for node in self._nodes.values() if node.id != self.node_id and not node.draining]
            if self.local_specs and not others:
                raise ApiError("no_other_node", "no other live node can take this node's sources over")
            self.draining = True
            handed: dict[str, str] = {}  # source -> the node it was handed to
            no_room: list[str] = []
            await self._publish()  # others stop placing here at once
            loads = {node.id: node.score for node in others}
            for source_id, spec in list(self.local_specs.items()):
                # Placed like a new source, by the script that counts each node's sources in Redis: a full node
                # would never take what is handed to it, and the drain (a SIGTERM's too) would wait
                # drain_timeout_s for nothing. The source is already in the cluster's total, so no total limit.
                ranking = sorted(loads, key=lambda node_id: (loads[node_id], node_id))
                moved = spec | {"placed_at": time.time()}
                placements = [arg for node_id in ranking for arg in (node_id, json.dumps(moved | {"node": node_id}))]
                target = await self.redis.eval(_PLACE, 1, self._key("sources"), _NO_TOTAL_LIMIT,
                                               self.settings.sessions.max_sources, self._key("lease", ""), source_id,
                                               *placements)
                if target:
                    loads[target] = (loads[target][0] + 1, loads[target][1])
                    handed[source_id] = target
                else:
                    no_room.append(source_id)
                await self._stop_local(source_id)
                await self.redis.eval(_RELEASE, 1, self._key("lease", source_id), self.node_id)
        deadline = time.monotonic() + self.config.drain_timeout_s
        waiting, gone = list(handed), []
        while waiting and time.monotonic() < deadline:
            holders = await self.redis.mget([self._key("lease", sid) for sid in waiting])
            waiting = [sid for sid, holder in zip(waiting, holders, strict=True) if holder is None]
            # A receiver that has since left or begun draining takes nothing: stop waiting for it. The source
            # stays placed and the next node with room takes it, as after a node's death.
            receivers = await self._read_nodes() if waiting else {}
            gone += [sid for sid in waiting if handed[sid] not in receivers or receivers[handed[sid]].draining]
            waiting = [sid for sid in waiting if sid not in gone]
            if waiting:
                await asyncio.sleep(0.1)
        return {"node": self.node_id, "handed_over": list(handed), "not_taken": no_room + gone + waiting}

    async def nodes(self) -> list[dict[str, Any]]:
        try:
            nodes = await self._read_nodes()
        except (aioredis.RedisError, OSError):
            self._redis_lost()
        return [{"id": n.id, "url": n.url, "draining": n.draining, "load": n.load, "self": n.id == self.node_id}
                for n in nodes.values()]


CLUSTER = web.AppKey("cluster", ClusterNode)  # only with cluster.redis_url
