"""The one route table (``server.app.route_table``): every front-end's routes, as configured, feed both
the router and ``/openapi.json``; cluster mode swaps handlers, never paths, and adds ``/api/cluster/*``."""

from __future__ import annotations

from collections import Counter

from server.app import route_table
from server.config import load_settings
from server.http.openapi import build_openapi


def _keys(routes) -> set[tuple[str, str]]:
    return {(route.method, route.path) for route in routes}


def test_no_route_is_listed_twice():
    settings = load_settings(None, {"cluster": {"redis_url": "redis://127.0.0.1:1/0"}})
    counts = Counter((route.method, route.path) for route in route_table(settings))
    assert [key for key, n in counts.items() if n > 1] == []


def test_cluster_mode_adds_its_routes_and_keeps_every_other_path():
    alone = route_table(load_settings(None))
    cluster = route_table(load_settings(None, {"cluster": {"redis_url": "redis://127.0.0.1:1/0"}}))
    assert _keys(cluster) - _keys(alone) == {("GET", "/api/cluster/nodes"), ("POST", "/api/cluster/drain")}
    assert _keys(alone) <= _keys(cluster)
    by_key = {(r.method, r.path): r for r in alone}
    swapped = {(r.method, r.path) for r in cluster if (r.method, r.path) in by_key and r.handler is not
               by_key[r.method, r.path].handler}
    assert {("POST", "/api/sources"), ("GET", "/api/sources"), ("GET", "/api/sessions"),
            ("GET", "/api/sources/{source_id}/scene")} <= swapped
    assert all(key[1].startswith(("/api/sources", "/api/sessions")) for key in swapped)
    assert "/api/cluster/nodes" in build_openapi(list(cluster))["paths"]
    # the same document but for the cluster's own routes: operation ids included
    names = {(r.method, r.path): r.handler.__name__ for r in alone}
    assert {(r.method, r.path): r.handler.__name__ for r in cluster if (r.method, r.path) in names} == names


def test_v1_routes_follow_the_config():
    on = _keys(route_table(load_settings(None)))
    off = _keys(route_table(load_settings(None, {"api": {"chat": False}, "transcription": {"enabled": False},
                                                 "speech": {"enabled": False}})))
    assert ("POST", "/v1/chat/completions") in on and ("POST", "/v1/audio/speech") in on
    assert not any(path.startswith("/v1/") for _, path in off)


def test_the_gets_that_always_answered_head_still_do():
    # aiohttp's add_get, which the /v1 and cluster modules used before the one table, also answers HEAD
    table = route_table(load_settings(None, {"cluster": {"redis_url": "redis://127.0.0.1:1/0"}}))
    head = {r.path for r in table if r.head}
    assert all(r.method == "GET" for r in table if r.head)
    assert {r.path for r in table if r.method == "GET" and r.path.startswith(("/v1/", "/api/cluster/"))} == head
