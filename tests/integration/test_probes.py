"""Probes: /healthz (alias /livez) and /readyz answer an orchestrator without the token and reveal nothing
without it; /readyz tells starting from ready and, with the token, which model is in which state."""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from server.app import create_app
from server.config import load_settings
from server.http.probes import readyz
from server.v1.chat_service import CHAT_SERVICE
from tests.support.scripted_llm import ScriptedLlmForTest


async def _get(url: str, token: str | None = None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as response:
        return response.status, await response.json()


async def test_probes_need_no_token_and_reveal_nothing_without_it(vigil):
    server = await vigil(auth={"token": "s3cret"})
    assert await _get(server.url + "/livez") == (200, {"status": "ok"})
    assert await _get(server.url + "/readyz") == (200, {"status": "ready"})
    assert await _get(server.url + "/readyz", token="wrong") == (200, {"status": "ready"})
    status, detailed = await _get(server.url + "/readyz", token="s3cret")
    assert status == 200 and detailed["models"] == {
        "detector": "off", "voice": "off", "chat": "on_first_use", "transcription": "on_first_use",
        "speech": "on_first_use", "memory": "off"}
    assert await _get(server.url + "/healthz") == (200, {"status": "ok"})  # liveness; details need the token
    assert await _get(server.url + "/healthz", token="wrong") == (200, {"status": "ok"})
    status, health = await _get(server.url + "/healthz", token="s3cret")
    assert status == 200 and set(health) == {"status", "version", "sessions", "sources"}

    model = server.settings.models.llm.model
    server.app[CHAT_SERVICE].use_llm_for_test(ScriptedLlmForTest(["Hello."], name=model))
    async with aiohttp.ClientSession() as http, http.post(
        server.url + "/v1/chat/completions", headers={"Authorization": "Bearer s3cret"},
        json={"model": model, "messages": [{"role": "user", "content": "Hi"}]},
    ) as response:
        assert response.status == 200
    _, detailed = await _get(server.url + "/readyz", token="s3cret")
    assert detailed["models"]["chat"] == "loaded"


async def test_readyz_is_503_until_start_up_is_over(clip_dir, tmp_path):
    settings = load_settings(None, {"models": {"detector": {"backend": "none"}}, "voice": {"enabled": False},
                                    "grpc": {"enabled": False}, "sources": {"media_root": str(clip_dir)},
                                    # the defaults but in tmp_path: never the checkout's data/
                                    "storage": {"data_dir": str(tmp_path / "timeline")},
                                    "memory": {"data_dir": str(tmp_path / "memory")},
                                    "transcription": {"data_dir": str(tmp_path / "transcription")}})
    app = create_app(settings)
    response = await readyz(make_mocked_request("GET", "/readyz", app=app))
    assert response.status == 503 and json.loads(response.text)["status"] == "starting"
    runner = web.AppRunner(app)
    await runner.setup()  # runs the app's start-up
    try:
        response = await readyz(make_mocked_request("GET", "/readyz", app=app))
        assert response.status == 200
    finally:
        await runner.cleanup()
