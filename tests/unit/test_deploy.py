"""The reference deployment (deploy/): every file parses, and every Vigil setting it makes (config file, VIGIL_*
environment) exists in the config tree and loads through ``load_settings``; probes, scraping, the balancer and the
service addresses agree with what Vigil serves."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from pydantic import BaseModel

from server.app import route_table
from server.config import Settings, load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
READYZ = "/readyz"  # the readiness endpoint (beside /healthz)


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def _compose() -> dict[str, Any]:
    return _documents(DEPLOY / "compose.yaml")[0]


def _k8s(kind: str, name: str) -> dict[str, Any]:
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for doc in _documents(path):
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise AssertionError(f"no {kind} {name} in deploy/k8s")


def _assert_setting_exists(variable: str) -> None:
    """VIGIL_<SECTION>__<KEY>[__<KEY>...] names a field of the config tree."""
    assert variable.startswith("VIGIL_"), variable
    model: type[BaseModel] = Settings
    for part in variable.removeprefix("VIGIL_").lower().split("__"):
        assert part in model.model_fields, f"{variable}: no setting {part!r} in {model.__name__}"
        annotation = model.model_fields[part].annotation
        model = annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else BaseModel


def _load_with_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, config_text: str,
                   env: dict[str, str]) -> Settings:
    config = tmp_path / "vigil.yaml"
    config.write_text(config_text)
    with monkeypatch.context() as patch:
        for name in [n for n in os.environ if n.startswith("VIGIL_")]:  # only what the deployment sets
            patch.delenv(name)
        for name, value in env.items():
            if name.startswith("VIGIL_"):
                _assert_setting_exists(name)
                patch.setenv(name, value)
        return load_settings(config)


def _routes() -> set[str]:
    return {route.path for route in route_table(load_settings(None)) if route.method == "GET"}


def test_every_deploy_file_parses():
    files = sorted(DEPLOY.rglob("*.y*ml"))
    assert {f.name for f in files} >= {"compose.yaml", "vigil.yaml", "prometheus.yml", "redis.yaml",
                                       "triton.yaml", "vllm.yaml", "prometheus.yaml"}
    for path in files:
        assert _documents(path), path
    for path in (DEPLOY / "k8s").glob("*.yaml"):
        for doc in _documents(path):
            assert {"apiVersion", "kind", "metadata"} <= doc.keys(), (path, doc)


def test_the_shared_node_config_loads_and_names_the_deployed_services():
    settings = load_settings(DEPLOY / "vigil.yaml")
    assert settings.cluster.redis_url is not None and settings.models.detector.backend == "triton"
    services = _compose()["services"]
    triton = urlsplit(settings.models.detector.triton.url)
    assert triton.scheme == "grpc" and triton.hostname in services and triton.port == 8001
    redis_hosts = {urlsplit(settings.cluster.redis_url.get_secret_value()).hostname,
                   urlsplit(settings.redis.url.get_secret_value()).hostname}  # type: ignore[union-attr]
    assert redis_hosts == {"redis"} and "redis" in services
    assert {urlsplit(u.base_url).hostname for u in settings.models.llm.upstreams} == {"vllm"}
    # The Kubernetes ConfigMap carries the very same file.
    configmap = _k8s("ConfigMap", "vigil-config")
    assert yaml.safe_load(configmap["data"]["vigil.yaml"]) == yaml.safe_load((DEPLOY / "vigil.yaml").read_text())


def test_compose_nodes_settings_probes_balancer_and_scraping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    compose = _compose()
    config_text = (DEPLOY / "vigil.yaml").read_text()
    nodes = {name: service for name, service in compose["services"].items() if service.get("image") == "vigil:latest"}
    assert len(nodes) >= 2
    seen_ids, seen_addresses = set(), set()
    for service in nodes.values():
        config_path = service["command"][service["command"].index("--config") + 1]
        assert f"./vigil.yaml:{config_path}:ro" in service["volumes"]
        settings = _load_with_env(monkeypatch, tmp_path, config_text, service["environment"])
        address = service["networks"]["vigil"]["ipv4_address"]
        assert settings.webrtc.host_addresses == [address]  # each node offers its own ICE address
        assert settings.cluster.advertise_url == f"http://{address}:{settings.server.port}"
        seen_ids.add(settings.cluster.node_id)
        seen_addresses.add(address)
        probe = service["healthcheck"]["test"]
        assert probe[-1] == f"http://127.0.0.1:{settings.server.port}/healthz" and "/healthz" in _routes()
        grace = float(service["stop_grace_period"].removesuffix("s"))
        assert service["stop_signal"] == "SIGTERM" and grace > settings.cluster.drain_timeout_s
    assert len(seen_ids) == len(seen_addresses) == len(nodes)
    port = load_settings(DEPLOY / "vigil.yaml").server.port
    # HAProxy: least connections over exactly these nodes, readiness-checked.
    haproxy = (DEPLOY / "haproxy.cfg").read_text()
    assert re.search(r"^\s*balance leastconn$", haproxy, re.M)
    assert re.search(rf"^\s*option httpchk GET {READYZ}$", haproxy, re.M)
    assert sorted(re.findall(r"^\s*server (\S+) (\S+) check$", haproxy, re.M)) == sorted(
        (name, f"{name}:{port}") for name in nodes)
    # Prometheus scrapes /metrics on every node.
    scrape = {job["job_name"]: job for job in yaml.safe_load((DEPLOY / "prometheus.yml").read_text())[
        "scrape_configs"]}
    assert scrape["vigil"]["metrics_path"] == "/metrics" and "/metrics" in _routes()
    assert sorted(scrape["vigil"]["static_configs"][0]["targets"]) == sorted(f"{n}:{port}" for n in nodes)
    assert set(compose["services"]) >= {"redis", "triton", "vllm", "prometheus", "lb"}


def test_kubernetes_nodes_settings_probes_and_scraping(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    deployment = _k8s("Deployment", "vigil")
    pod = deployment["spec"]["template"]
    container = pod["spec"]["containers"][0]
    env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    fields = {item["name"] for item in container["env"] if "valueFrom" in item}
    # Kubernetes expands $(VAR) from earlier variables: only ones defined above may be used.
    for value in env.values():
        assert set(re.findall(r"\$\((\w+)\)", value)) <= fields
    example = {name: value.replace("$(POD_NAME)", "vigil-7d9f-abcde").replace("$(HOST_IP)", "10.0.0.5")
               for name, value in env.items()}
    configmap = _k8s("ConfigMap", "vigil-config")
    settings = _load_with_env(monkeypatch, tmp_path, configmap["data"]["vigil.yaml"], example)
    assert settings.webrtc.host_addresses == ["10.0.0.5"] and settings.cluster.node_id == "vigil-7d9f-abcde"
    assert pod["spec"]["hostNetwork"] is True  # ICE offers the Kubernetes node's own address
    assert container["args"] == ["serve", "--config", "/etc/vigil/vigil.yaml"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports["http"] == settings.server.port and ports["grpc"] == settings.grpc.port
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz" and "/healthz" in _routes()
    assert container["readinessProbe"]["httpGet"]["path"] == READYZ
    assert pod["spec"]["terminationGracePeriodSeconds"] > settings.cluster.drain_timeout_s
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == "/metrics" and annotations["prometheus.io/port"] == str(ports["http"])
    assert _k8s("Ingress", "vigil")["metadata"]["annotations"]["haproxy.org/load-balance"] == "leastconn"
    # The services the config names exist, on the ports it uses.
    triton = urlsplit(settings.models.detector.triton.url)
    assert triton.port in [p["port"] for p in _k8s("Service", triton.hostname)["spec"]["ports"]]
    assert 6379 in [p["port"] for p in _k8s("Service", "redis")["spec"]["ports"]]
    assert 8000 in [p["port"] for p in _k8s("Service", "vllm")["spec"]["ports"]]
    scrape = yaml.safe_load(_k8s("ConfigMap", "prometheus-config")["data"]["prometheus.yml"])
    assert scrape["scrape_configs"][0]["kubernetes_sd_configs"] == [{"role": "pod"}]


def test_a_misspelt_setting_would_be_caught():
    """The key check the deploy tests rely on refuses names the config tree lacks."""
    _assert_setting_exists("VIGIL_CLUSTER__REDIS_URL")
    with pytest.raises(AssertionError, match="no setting"):
        _assert_setting_exists("VIGIL_CLUSTER__REDIS_URI")
    with pytest.raises(AssertionError, match="no setting"):
        _assert_setting_exists("VIGIL_WEBRTC__HOST_ADDRESS")
