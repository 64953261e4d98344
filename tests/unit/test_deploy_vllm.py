"""The GPU recipe for vLLM + Vigil (deploy/vllm-gpu.yaml, deploy/vigil-vllm-gpu.yaml): Vigil's config loads, and
what it expects of vLLM (address, served model name, context window) is what the vLLM service is started with.
The recipe has not run on a GPU here; this keeps its two halves from drifting apart."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import yaml

from server.config import load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _flags(command: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(command, [*command[1:], ""], strict=True) if flag.startswith("--")}


def test_vigil_asks_the_vllm_service_for_what_it_serves():
    compose = yaml.safe_load((DEPLOY / "vllm-gpu.yaml").read_text())
    vllm, vigil = compose["services"]["vllm"], compose["services"]["vigil"]
    flags = _flags(vllm["command"])
    settings = load_settings(DEPLOY / "vigil-vllm-gpu.yaml")
    llm = settings.models.llm
    assert llm.backend == "openai"
    (upstream,) = llm.upstreams
    url = urlsplit(upstream.base_url)
    assert (url.hostname, str(url.port), url.path) == (flags["--host"], flags["--port"], "/v1")
    assert vllm["network_mode"] == vigil["network_mode"] == "host"  # 127.0.0.1 is the same host for both
    assert llm.model == flags["--served-model-name"] and upstream.models == [flags["--served-model-name"]]
    # Vigil fits prompts to the window it is told; vLLM refuses any longer one (tests/integration/test_vllm.py).
    assert upstream.context_window == int(flags["--max-model-len"])
    assert flags["--model"].startswith("/models/") and "./models/llm:/models:ro" in vllm["volumes"]
    assert vllm["environment"]["HF_HUB_OFFLINE"] == "1"  # nothing downloaded at run time
    mounted = {v.split(":")[0] for v in vigil["volumes"]}
    assert mounted == {"./vigil-vllm-gpu.yaml"}
