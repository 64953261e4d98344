"""Config precedence and errors, and the ``vigil`` command line (serve, config show, analyze, replay)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from server.config import ConfigError, load_settings
from tests.support.vigil_process import VigilProcess

VIGIL = [sys.executable, "-m", "server.cli"]


def test_file_then_env_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    config = tmp_path / "vigil.yaml"
    config.write_text("server:\n  port: 9000\n  host: 0.0.0.0\nvideo:\n  target_fps: 3\n"
                      "webrtc:\n  host_addresses: ['127.0.0.1']\n")
    monkeypatch.setenv("VIGIL_SERVER__PORT", "9100")
    monkeypatch.setenv("VIGIL_AUTH__TOKEN", "from-env")
    settings = load_settings(config, {"server": {"host": "127.0.0.2"}})
    assert settings.server.port == 9100  # env beats file
    assert settings.server.host == "127.0.0.2"  # flags beat env and file
    assert settings.video.target_fps == 3  # file beats defaults
    assert settings.webrtc.host_addresses == ["127.0.0.1"]
    assert settings.webrtc.ice_servers == []  # never a public STUN server by default
    assert settings.auth.token is not None and settings.auth.token.get_secret_value() == "from-env"
    toml = tmp_path / "vigil.toml"
    toml.write_text('[sources]\nmedia_root = "/srv/media"\n')
    monkeypatch.delenv("VIGIL_SERVER__PORT")
    assert str(load_settings(toml).sources.media_root) == "/srv/media"


@pytest.mark.parametrize(
    ("yaml_text", "env", "key"),
    [
        ("video:\n  target_fps: -2\n", {}, "video.target_fps"),
        ("server:\n  prot: 1\n", {}, "server.prot"),
        ("", {"VIGIL_SESSIONS__MAX_SESSIONS": "zero"}, "sessions.max_sessions"),
        ("sources:\n  rtsp_transport: sctp\n", {}, "sources.rtsp_transport"),
    ],
)
def test_a_wrong_value_names_its_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, yaml_text, env, key):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml_text)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(config)


def test_serve_refuses_a_wrong_value_with_the_key_in_the_message(tmp_path: Path):
    result = subprocess.run([*VIGIL, "serve", "--port", "70000"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "server.port" in result.stderr


def test_config_show_masks_secrets(tmp_path: Path):
    env = {**os.environ, "VIGIL_AUTH__TOKEN": "hunter2", "VIGIL_MODELS__LLM__API_KEY": "sk-abc"}
    result = subprocess.run([*VIGIL, "config", "show"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert "hunter2" not in result.stdout and "sk-abc" not in result.stdout
    assert shown["auth"]["token"] == "**********"
    assert shown["webrtc"]["ice_servers"] == []


def test_serve_starts_with_file_env_and_flags(tmp_path: Path):
    config = tmp_path / "vigil.toml"
    config.write_text('[server]\nport = 1\n[auth]\ntoken = "t0k"\n'
                      + "".join(f'[{section}]\ndata_dir = "{tmp_path / section}"\n'  # never the checkout's data/
                                for section in ("storage", "memory", "transcription")))
    server = VigilProcess(tmp_path, config_file=config, token="t0k")  # the token from the file
    try:
        server.start(timeout=60)  # /healthz answered with the file's token, on the --port flag's port
        assert server.api("GET", "/healthz")["status"] == "ok"
    finally:
        server.stop()


def test_analyze_is_deterministic_and_writes_json_lines(tmp_path: Path, clip_dir: Path):
    outputs = []
    for run in range(2):
        out = tmp_path / f"run{run}.jsonl"
        result = subprocess.run([*VIGIL, "analyze", str(clip_dir / "long.mp4"), "-o", str(out), "--fps", "5"],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        assert "long.mp4" in result.stderr  # the progress bar
        outputs.append(out.read_text())
    runs = [[json.loads(line) for line in output.splitlines()] for output in outputs]
    for message in runs[0] + runs[1]:
        message.pop("inference_ms", None)  # the one wall-clock measurement in the output
    assert runs[0] == runs[1]
    messages = runs[0]
    assert messages[1]["type"] == "hello" and messages[1]["config"]["video"]["target_fps"] == 5
    states = [m["data"]["state"] for m in messages if m["type"] == "event"]
    assert states == ["connecting", "live", "ended"]
    final = messages[-1]
    assert final["type"] == "metrics"
    assert final["media"]["video"]["frames_in"] == 90 and final["media"]["video"]["frames_sampled"] == 30
    assert final["media"]["video"]["frames_dropped"] == 0


def test_analyze_reports_a_broken_file(tmp_path: Path):
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"\x00not a video" * 100)
    result = subprocess.run([*VIGIL, "analyze", str(broken), "-q"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "failed" in result.stderr


async def test_replay_streams_a_file_into_a_running_server(vigil, clip_dir: Path):
    server = await vigil()
    env = {**os.environ, "VIGIL_WEBRTC__HOST_ADDRESSES": '["127.0.0.1"]'}
    process = await asyncio.create_subprocess_exec(
        *VIGIL, "replay", str(clip_dir / "clip.mp4"), "--url", server.url, "--fps", "10",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), 90)
    assert process.returncode == 0, stderr.decode()
    messages = [json.loads(line) for line in stdout.decode().splitlines()]
    assert messages[0]["type"] == "hello" and messages[0]["config"]["video"]["target_fps"] == 10
    final = [m for m in messages if m["type"] == "metrics"][-1]
    assert final["media"]["video"]["frames_in"] >= 20  # most of the 30 frames arrive over real RTP
    assert final["media"]["audio"]["seconds_in"] > 1.0
    assert len(server.sessions) == 0  # replay closes its session


def test_echo_gating_is_on_by_default_only_for_sources_without_echo_cancelling():
    from server.engines import voice_loop_config

    settings = load_settings()
    assert settings.voice.echo_gating == "auto"
    assert voice_loop_config(settings, "rtsp").echo_gating and voice_loop_config(settings, "file").echo_gating
    assert not voice_loop_config(settings, "webrtc").echo_gating  # browsers cancel echo themselves
    forced = load_settings(None, {"voice": {"echo_gating": "on"}})
    assert voice_loop_config(forced, "webrtc").echo_gating
