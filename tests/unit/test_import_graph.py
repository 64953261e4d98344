"""The package import graph: imports point one way (server -> pipelines -> models) and no module imports itself
back through others, counting imports deferred into functions too (a deferred import hides a cycle, it does not
remove it). Inside server/ they point down its floors (``SERVER_FLOORS``), and only the composition root
(``server.app``) gathers the front-ends' routes."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("models", "pipelines", "server")  # lowest first: each may import only those before it (and itself)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for layer in LAYERS for p in (REPO / layer).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], base]).strip(".")
                targets.add(base)
                targets.update(f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_imports_point_one_way():
    upward = sorted(f"{source} -> {target}" for source, targets in import_graph().items() for target in targets
                    if _layer(target) > _layer(source))
    assert not upward, "imports against server -> pipelines -> models:\n" + "\n".join(upward)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (cycle := visit(target)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_package_graph_has_no_cycles():
    # A module's edge to its own package's __init__ (``from server import __version__``) is not followed: the
    # package runs first anyway, and an __init__ that re-exports its submodules is no cycle of concern.
    graph = {source: {t for t in targets if not source.startswith(t + ".")}
             for source, targets in import_graph().items()}
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


FRONT_ENDS = ("server.http", "server.media", "server.v1", "server.records", "server.cluster", "server.grpc_api",
              "server.cli")


def _front_end(module: str) -> str | None:
    return next((f for f in FRONT_ENDS if module == f or module.startswith(f + ".")), None)


def test_the_cli_is_a_leaf():
    # The command and the client library sit on top: no server module needs them (tests and benches may).
    into_cli = sorted(f"{source} -> {target}" for source, targets in import_graph().items() for target in targets
                      if _front_end(target) == "server.cli" and _front_end(source) != "server.cli")
    assert not into_cli, "imports of the CLI from the server:\n" + "\n".join(into_cli)


def test_live_media_imports_no_other_front_end():
    # Sessions and sources are the core the cluster, the records and the route table build on, never the other way;
    # of server.http only the plumbing (errors, the Route type), not the table that gathers everyone's routes.
    outward = sorted(f"{source} -> {target}" for source, targets in import_graph().items() for target in targets
                     if _front_end(source) == "server.media" and _front_end(target) not in (None, "server.media")
                     and target not in ("server.http.errors", "server.http.route"))
    assert not outward, "server.media importing another front-end:\n" + "\n".join(outward)


# The floors of server/, lowest first: a module may import its own floor and those below, never one above. Each
# entry names a package or module and so its submodules (``server`` only its own __init__, so that a new package
# must be placed); the longest entry that matches a module decides its floor.
SERVER_FLOORS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # what every front-end may use: the config, the HTTP plumbing (errors, auth, the Route type, OpenAPI, serving),
    # and the keys of what the app holds whose types no server module owns
    ("plumbing", ("server", "server.config", "server.allocator", "server.metrics",
                  "server.state", "server.http")),
    ("engines", ("server.engines",)),  # the models, and the analysers each session and source gets
    # the front-ends; the probes read every front-end's state to answer /readyz, so they sit beside them
    ("front-ends", ("server.media", "server.records", "server.v1", "server.cluster", "server.grpc_api",
                    "server.mqtt", "server.mcp_api", "server.http.probes")),
    ("wiring", ("server.services",)),  # builds every front-end's services, once
    ("composition root", ("server.app",)),  # the route table, the keys set, the services mounted
    ("cli", ("server.cli",)),
)


def server_floor(module: str) -> int:
    matches = [(len(prefix), floor) for floor, (_, prefixes) in enumerate(SERVER_FLOORS) for prefix in prefixes
               if module == prefix or (prefix != "server" and module.startswith(prefix + "."))]
    assert matches, f"{module} is on no floor of server/: add it to SERVER_FLOORS"
    return max(matches)[1]


def imports_up_a_floor(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{source} ({SERVER_FLOORS[server_floor(source)][0]}) -> {target} "
                  f"({SERVER_FLOORS[server_floor(target)][0]})"
                  for source, targets in graph.items() if source.startswith("server.") or source == "server"
                  for target in targets if target.startswith("server.")
                  and server_floor(target) > server_floor(source))


def test_server_imports_point_down_its_floors():
    upward = imports_up_a_floor(import_graph())
    assert not upward, f"{len(upward)} imports up a floor of server/:\n" + "\n".join(upward)


def test_the_floor_check_finds_an_upward_import():
    assert imports_up_a_floor({"server.engines": {"server.media.sessions"}, "server.media.sessions": set()}) == [
        "server.engines (engines) -> server.media.sessions (front-ends)"]
    assert imports_up_a_floor({"server.app": {"server.media.sessions"}}) == []


ROUTE_OWNERS = ("server.media", "server.cluster", "server.records", "server.v1")  # the front-ends serving HTTP


def _route_imports() -> dict[str, set[str]]:
    """Each server module's imports of a route tuple or table (``MEDIA_ROUTES``, ``v1_routes``, ...) from
    another package: module -> the modules it takes them from."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "server").rglob("*.py"):
        name = _module_name(path)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.startswith("server.")
                    and node.module.rpartition(".")[0] != name.rpartition(".")[0]
                    and any(alias.name.lower().endswith("_routes") for alias in node.names)):
                found.setdefault(name, set()).add(node.module)
    return found


def test_only_the_composition_root_gathers_the_front_ends_routes():
    importers = _route_imports()
    outside = sorted(module for module in importers if module != "server.app" and _front_end(module) != "server.cli")
    assert not outside, "modules gathering other packages' routes besides server.app: " + ", ".join(outside)
    gathered = {owner for owner in ROUTE_OWNERS for module in importers.get("server.app", ())
                if module.startswith(owner + ".")}
    assert gathered == set(ROUTE_OWNERS), f"server.app imports no routes of {sorted(set(ROUTE_OWNERS) - gathered)}"


def test_the_session_pipeline_is_imported_only_by_its_callers_in_server():
    # Its parts (analysers, the voice loop, the recorder, sources) take their types from pipelines.ports and see
    # their session as a SessionView; only the front-ends that build and drive a session import it.
    importers = sorted(source for source, targets in import_graph().items() if "pipelines.session" in targets)
    inside = [source for source in importers if not source.startswith("server.")]
    assert not inside, "pipelines.session imported for its types by:\n" + "\n".join(inside)


def test_the_session_pipeline_stays_small():
    lines = len((REPO / "pipelines" / "session.py").read_text().splitlines())
    assert lines <= 400, f"pipelines/session.py has {lines} lines: move a concept into a module of its own"
